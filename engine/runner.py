"""Turns a StepPlan into one llama_batch, decodes it, and hands back the output logits.

With flash attention, a batch of FLASH_ATTN_TILE_ROWS rows or more that mixes decoding sequences'
rows with prompt chunks is decoded as two llama_decode calls: the decoding rows, then the prompt
chunks. In one call, ggml's tiled kernel would have the decode rows' tile attend over every cell
of the unified cache (bindings/context.py); apart, a decode row (below that size) skips the other
sequences' cells, and the prompt chunks' tiles skip whole blocks of them.
A step is still all or nothing: if the second call fails, the cells of the first are removed.
"""
from __future__ import annotations

import numpy as np

from bindings import (
    FLASH_ATTN_TILE_ROWS, Context, ContextSettings, DecodeInterrupter, DecodeOutcome, Model, TokenBatch,
)
from engine import prompt_scores
from engine.config import EngineConfig
from engine.ownership import SingleWriter
from engine.step_plan import Chunk, StepPlan
from engine.sequence import Sequence


class ModelRunner(SingleWriter):
    """Owns the llama.cpp context. Only the engine thread may call it."""

    def __init__(self, model: Model, config: EngineConfig) -> None:
        self.model = model
        n_seq_max = config.sequence_ids + (config.cache_holders if config.prefix_cache else 0)
        # Our batches never exceed the step budget; llama.cpp still wants room for one output
        # per seq id in a ubatch.
        n_batch = max(config.step_token_budget, n_seq_max)
        self.context = Context(
            model,
            ContextSettings(
                n_ctx=config.n_ctx,
                n_batch=n_batch,
                n_ubatch=n_batch,
                n_seq_max=n_seq_max,
                n_threads=config.n_threads,
                n_threads_batch=config.n_threads,
                swa_full=config.prefix_cache,
                flash_attn=1 if config.flash_attn else 0,
            ),
        )
        self.batch = TokenBatch(config.step_token_budget)
        self._n_outputs = 0
        self._layout: prompt_scores.OutputLayout | None = None
        self._threads = config.n_threads
        self._split = config.flash_attn
        self._calls: list[tuple[int, int, list[Chunk]]] = []  # row ranges decoded apart, and their chunks
        self._outputs: np.ndarray | None = None  # the outputs of a step decoded in several calls

    @property
    def interrupter(self) -> DecodeInterrupter:
        return self.context.interrupter

    @property
    def n_ctx(self) -> int:
        """The KV cells llama.cpp gave the context (it may round the configured n_ctx up)."""
        return self.context.n_ctx

    def build_batch(self, plan: StepPlan) -> list[Sequence]:
        """Fill the batch; returns the sequence owning each sampling row, in row order (a chunk
        with a draft owns one row more per drafted token the grammar does not force, consecutive)."""
        batch = self.batch
        batch.clear()
        # Decode rows first, then decoding sequences' runs (drafts, forced tokens), prompt chunks
        # last: the rows a split decodes apart (decode_calls) are then contiguous.
        single = [c for c in plan.chunks if c.n_rows == 1 and not _last_call(c)]
        if single:
            # Decode rows, one per generating sequence, filled in one vectorised write.
            n = len(single)
            batch.token[:n] = [c.seq.tokens[c.start] for c in single]
            batch.pos[:n] = [c.start for c in single]
            batch.seq_ids[:n, 0] = [c.seq.seq_id for c in single]
            batch.n_seq_id[:n] = 1
            batch.logits[:n] = [c.wants_logits for c in single]
            batch.n_tokens = n
        placed = [(c, i) for i, c in enumerate(single)]
        runs = sorted((c for c in plan.chunks if c.n_rows > 1 or _last_call(c)), key=_last_call)
        for c in runs:
            tokens = np.asarray([*c.seq.tokens[c.start : c.start + c.length], *c.draft], dtype=np.int32)
            last = batch.add_run(tokens, c.start, c.seq.seq_id, c.wants_logits, n_logits=1 + len(c.draft))
            if c.wants_logits and c.forced:  # the rows before forced drafted tokens need none
                sampling_row = last - len(c.draft)
                batch.logits[[sampling_row + j for j, forced in enumerate(c.forced) if forced]] = 0
            placed.append((c, last - c.n_rows + 1))
        self._layout = prompt_scores.map_outputs(batch.logits, batch.n_tokens, placed)
        self._n_outputs = batch.n_outputs
        self._calls = decode_calls(placed, batch.n_tokens) if self._split else []
        self._outputs = None
        return [c.seq for c, _ in placed if c.wants_logits for _ in c.logit_rows]

    @property
    def n_outputs(self) -> int:
        """Rows of the built batch that produce logits: sampling rows and scored prompt rows."""
        return self._n_outputs

    def set_threads(self, n_threads: int) -> None:
        if n_threads != self._threads:
            self.context.set_threads(n_threads)
            self._threads = n_threads

    def decode(self) -> DecodeOutcome:
        if len(self._calls) < 2:
            return self.context.decode(self.batch)
        batch, context = self.batch, self.context
        outputs = np.empty((self._n_outputs, context.n_vocab), dtype=np.float32)
        filled = 0
        for i, (start, stop, _) in enumerate(self._calls):
            outcome = context.decode(batch, start, stop)
            if outcome is not DecodeOutcome.OK:
                for _, _, chunks in self._calls[:i]:  # llama.cpp rolled back this call; undo the ones before
                    for c in chunks:
                        context.seq_rm(c.seq.seq_id, c.start, -1)
                return outcome
            n = int(np.count_nonzero(batch.logits[start:stop]))
            outputs[filled:filled + n] = context.logits(n)
            filled += n
        self._outputs = outputs
        return DecodeOutcome.OK

    @property
    def decode_calls(self) -> int:
        """llama_decode calls the built batch takes."""
        return max(1, len(self._calls))

    def _block(self) -> np.ndarray:
        return self.context.logits(self._n_outputs) if self._outputs is None else self._outputs

    def output_logits(self) -> np.ndarray:
        """The sampling rows' logits, in the order build_batch returned their sequences."""
        block = self._block()
        return block if self._layout is None else block[self._layout.sampling]

    def record_prompt_scores(self) -> None:
        """Score the prompt rows of the step just decoded (requests with prompt_logprobs)."""
        if self._layout is not None:
            prompt_scores.record(self._block(), self._layout)

    def import_cells(self, seq_id: int, cells: bytes) -> bool:
        """Give seq_id the KV cells another context exported (False: no room for them)."""
        return self.context.import_sequence(seq_id, cells)

    def close(self) -> None:
        self.context.close()


def _last_call(chunk: Chunk) -> bool:
    """Whether a split decodes the chunk in its second call: a prompt chunk (or a recompute)."""
    return not chunk.seq.is_decoding


def decode_calls(placed: list[tuple[Chunk, int]], n_rows: int) -> list[tuple[int, int, list[Chunk]]]:
    """Row ranges to decode apart, with their chunks, for a batch laid out as build_batch lays it
    out (each chunk with its first row); [] for one call. Apart only at FLASH_ATTN_TILE_ROWS rows
    or more, where ggml's tiled attention kernel takes the batch, and only where decoding
    sequences' rows share it with prompt chunks: the former, then the latter. Decoding rows alone
    stay one call: cut into pieces below the tile, drafted steps at sixteen streams looked cheap
    enough to draft and lost (docs/kv-cache.md)."""
    first = [(c, row) for c, row in placed if not _last_call(c)]
    second = [(c, row) for c, row in placed if _last_call(c)]
    if n_rows < FLASH_ATTN_TILE_ROWS or not first or not second:
        return []
    boundary = second[0][1]
    assert all(row < boundary for _, row in first), "prompt chunks must come last"
    return [(0, boundary, [c for c, _ in first]), (boundary, n_rows, [c for c, _ in second])]
