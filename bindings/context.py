"""A llama_context with one unified KV cache shared by every sequence, and its memory ops."""
from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass

import llama_cpp
import numpy as np

from bindings.token_batch import TokenBatch
from bindings.interrupt import DecodeInterrupter
from bindings.model import Model


LLAMA_MAX_SEQ = 256  # llama.cpp's compile-time limit on seq ids (src/llama-cparams.h)


class DecodeOutcome(enum.Enum):
    OK = 0
    KV_FULL = 1  # no KV slot for the batch: free cells or shrink the batch, then retry
    ABORTED = 2


# ggml's CPU flash attention switches to a tiled kernel once a decode has this many rows
# (GGML_FA_TILE_Q). That kernel skips a block of KV cells only where every row of its tile masks
# all of them, so a tile holding rows of several sequences attends over every used cell of a
# unified cache; below it, each row skips the cells its mask hides, one by one.
FLASH_ATTN_TILE_ROWS = 64


class DecodeError(RuntimeError):
    """llama_decode failed in a way that retrying cannot fix."""


@dataclass(frozen=True)
class ContextSettings:
    n_ctx: int = 8192
    n_batch: int = 512  # most tokens one llama_decode call may carry
    n_ubatch: int = 512
    n_seq_max: int = 32
    n_threads: int = 2
    n_threads_batch: int = 2
    # Gemma 3's sliding-window layers keep only the window unless this is set; prefix reuse of
    # arbitrary ranges needs the full cache, plain serving does not.
    swa_full: bool = False
    flash_attn: int = -1  # llama_flash_attn_type: -1 auto, 0 off, 1 on
    # One pool of n_ctx cells for all sequences (what the engine's block ledger and prefix sharing
    # need); False gives each of n_seq_max sequences its own n_ctx / n_seq_max cells.
    kv_unified: bool = True


class Context:
    """Owns a `llama_context`; close it before its Model."""

    def __init__(self, model: Model, settings: ContextSettings = ContextSettings()) -> None:
        if not 1 <= settings.n_seq_max <= LLAMA_MAX_SEQ:
            raise ValueError(f"n_seq_max must be between 1 and {LLAMA_MAX_SEQ}")
        if settings.n_seq_max > min(settings.n_batch, settings.n_ubatch):
            # llama.cpp reserves an output row per sequence at startup and aborts the process
            # (GGML_ASSERT n_outputs_max) when a ubatch cannot hold them.
            raise ValueError(
                f"n_batch and n_ubatch must be >= n_seq_max ({settings.n_seq_max}), got "
                f"{settings.n_batch} and {settings.n_ubatch}"
            )
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = settings.n_ctx
        params.n_batch = settings.n_batch
        params.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        params.n_seq_max = settings.n_seq_max
        params.n_threads = settings.n_threads
        params.n_threads_batch = settings.n_threads_batch
        params.kv_unified = settings.kv_unified
        params.swa_full = settings.swa_full
        params.flash_attn_type = settings.flash_attn
        params.no_perf = True
        handle = llama_cpp.llama_init_from_model(model.handle, params)
        if not handle:
            raise RuntimeError(f"llama.cpp could not create a context with {settings}")
        self._handle = handle
        self._memory = llama_cpp.llama_get_memory(handle)
        self.interrupter = DecodeInterrupter(handle)  # decode() returns ABORTED once it fires
        self.model = model
        self.settings = settings
        self.n_ctx: int = llama_cpp.llama_n_ctx(handle)
        self.n_vocab = model.n_vocab

    def decode(self, batch: TokenBatch, start: int = 0, stop: int | None = None) -> DecodeOutcome:
        """Decode the batch's rows [start, stop) (all by default)."""
        if batch.n_tokens == 0:
            raise ValueError("cannot decode an empty batch")
        stop = batch.n_tokens if stop is None else stop
        if stop - start > self.settings.n_batch:
            raise ValueError(f"batch of {stop - start} tokens exceeds n_batch={self.settings.n_batch}")
        status = llama_cpp.llama_decode(self._handle, batch.as_struct(start, stop))
        if status in (0, 1, 2):
            return DecodeOutcome(status)
        raise DecodeError(f"llama_decode failed with status {status}")

    def set_threads(self, n_threads: int) -> None:
        """Threads for the following decodes (takes effect at the next llama_decode)."""
        llama_cpp.llama_set_n_threads(self._handle, n_threads, n_threads)

    def logits(self, n_outputs: int) -> np.ndarray:
        """The output rows of the last decode, in batch order, as a view valid until the next decode."""
        if n_outputs == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = llama_cpp.llama_get_logits(self._handle)
        if not ptr:
            raise DecodeError("llama.cpp returned no logits")
        return np.ctypeslib.as_array(ptr, shape=(n_outputs, self.n_vocab))

    # KV memory ops. Positions: p0 inclusive, p1 exclusive; -1 means "to the end".
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self._memory, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, p0, p1)

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position held for the sequence, or -1 if it holds none."""
        return llama_cpp.llama_memory_seq_pos_min(self._memory, seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position held for the sequence, or -1 if it holds none."""
        return llama_cpp.llama_memory_seq_pos_max(self._memory, seq_id)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)

    def sequence_state_bytes(self, seq_id: int) -> int:
        """Bytes llama.cpp needs to save the sequence's state: its KV cells and a small header."""
        return int(llama_cpp.llama_state_seq_get_size(self._handle, seq_id))

    def export_sequence(self, seq_id: int) -> bytes:
        """The sequence's KV cells (positions and contents), for `import_sequence` elsewhere."""
        size = llama_cpp.llama_state_seq_get_size(self._handle, seq_id)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._handle, buffer, size, seq_id)
        if written == 0:
            raise DecodeError(f"llama.cpp could not save sequence {seq_id}")
        return ctypes.string_at(buffer, written)

    def import_sequence(self, seq_id: int, data: bytes) -> bool:
        """Replace the sequence's cells with exported ones (from a context with the same model and
        cache settings); False if llama.cpp found no room for them, and the sequence then holds none."""
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if llama_cpp.llama_state_seq_set_data(self._handle, buffer, len(data), seq_id) == 0:
            self.seq_rm(seq_id)
            return False
        return True

    def close(self) -> None:
        if self._handle is not None:
            llama_cpp.llama_free(self._handle)
            self._handle = None
            self._memory = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


