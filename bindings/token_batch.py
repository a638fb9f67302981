"""A preallocated llama_batch whose arrays are numpy-owned, so rows are filled with slices."""
from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np


class TokenBatchFullError(ValueError):
    pass


class TokenBatch:
    """Up to `capacity` token rows, each with a position, up to `max_seq_ids` seq ids and a logits flag.

    numpy owns every array and the `llama_batch` struct only points into them, so filling a
    4,000-token prompt chunk is a few slice assignments rather than 4,000 ctypes writes.
    """

    def __init__(self, capacity: int, max_seq_ids: int = 1) -> None:
        if capacity < 1 or max_seq_ids < 1:
            raise ValueError("a batch needs room for at least one token and one seq id")
        self.capacity = capacity
        self.max_seq_ids = max_seq_ids
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_ids = np.zeros((capacity, max_seq_ids), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        row_ptrs = self.seq_ids.ctypes.data + np.arange(capacity, dtype=np.uintp) * (4 * max_seq_ids)
        self._seq_id_rows = row_ptrs.astype(np.uintp)  # int32* per row, as the C struct wants
        self._struct = llama_cpp.llama_batch()
        self._struct.token = self.token.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
        self._struct.embd = ctypes.POINTER(ctypes.c_float)()
        self._struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        self._struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self._struct.seq_id = ctypes.cast(
            self._seq_id_rows.ctypes.data, ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id))
        )
        self._struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n_tokens = 0

    def clear(self) -> None:
        self.n_tokens = 0

    @property
    def free_rows(self) -> int:
        return self.capacity - self.n_tokens

    def add_run(self, tokens: np.ndarray | list[int], start_pos: int, seq_id: int, logits_last: bool,
                n_logits: int = 1) -> int:
        """Append consecutive tokens of one sequence, the last `n_logits` rows with logits when
        `logits_last`; returns the row of the last token."""
        n = len(tokens)
        if n == 0:
            raise ValueError("a run needs at least one token")
        if n > self.free_rows:
            raise TokenBatchFullError(f"batch has {self.free_rows} free rows, run needs {n}")
        lo, hi = self.n_tokens, self.n_tokens + n
        self.token[lo:hi] = tokens
        self.pos[lo:hi] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.n_seq_id[lo:hi] = 1
        self.seq_ids[lo:hi, 0] = seq_id
        self.logits[lo:hi] = 0
        if logits_last:
            self.logits[hi - n_logits:hi] = 1
        self.n_tokens = hi
        return hi - 1

    def add(self, token: int, pos: int, seq_ids: list[int] | tuple[int, ...], logits: bool) -> int:
        """Append one token that may belong to several sequences at once; returns its row."""
        if not 1 <= len(seq_ids) <= self.max_seq_ids:
            raise ValueError(f"a row takes 1 to {self.max_seq_ids} seq ids, got {len(seq_ids)}")
        if self.free_rows < 1:
            raise TokenBatchFullError("batch is full")
        row = self.n_tokens
        self.token[row] = token
        self.pos[row] = pos
        self.n_seq_id[row] = len(seq_ids)
        self.seq_ids[row, : len(seq_ids)] = seq_ids
        self.logits[row] = 1 if logits else 0
        self.n_tokens = row + 1
        return row

    @property
    def n_outputs(self) -> int:
        return int(np.count_nonzero(self.logits[: self.n_tokens]))

    def as_struct(self, start: int = 0, stop: int | None = None) -> llama_cpp.llama_batch:
        """Rows [start, stop) as a llama_batch (all rows by default); valid while this batch lives."""
        stop = self.n_tokens if stop is None else stop
        if not 0 <= start < stop <= self.n_tokens:
            raise ValueError(f"rows [{start}, {stop}) are not within the batch's {self.n_tokens}")
        if start == 0:
            self._struct.n_tokens = stop
            return self._struct
        part = llama_cpp.llama_batch()
        part.n_tokens = stop - start
        part.token = ctypes.cast(self.token.ctypes.data + start * self.token.itemsize,
                                 ctypes.POINTER(llama_cpp.llama_token))
        part.embd = ctypes.POINTER(ctypes.c_float)()
        part.pos = ctypes.cast(self.pos.ctypes.data + start * self.pos.itemsize, ctypes.POINTER(llama_cpp.llama_pos))
        part.n_seq_id = ctypes.cast(self.n_seq_id.ctypes.data + start * self.n_seq_id.itemsize,
                                    ctypes.POINTER(ctypes.c_int32))
        part.seq_id = ctypes.cast(self._seq_id_rows.ctypes.data + start * self._seq_id_rows.itemsize,
                                  ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id)))
        part.logits = ctypes.cast(self.logits.ctypes.data + start * self.logits.itemsize, ctypes.POINTER(ctypes.c_int8))
        return part
