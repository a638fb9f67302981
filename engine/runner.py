"""Turns a StepPlan into one llama_batch, decodes it, and hands back the output logits."""
from __future__ import annotations

import numpy as np

from bindings import TokenBatch, Context, ContextSettings, DecodeInterrupter, DecodeOutcome, Model
from engine import prompt_scores
from engine.config import EngineConfig
from engine.ownership import SingleWriter
from engine.step_plan import StepPlan
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

    @property
    def interrupter(self) -> DecodeInterrupter:
        return self.context.interrupter

    @property
    def n_ctx(self) -> int:
        """The KV cells llama.cpp gave the context (it may round the configured n_ctx up)."""
        return self.context.n_ctx

    def build_batch(self, plan: StepPlan) -> list[Sequence]:
        """Fill the batch; returns the sequence owning each sampling row, in row order (a chunk
        with a draft owns one row more per drafted token, consecutive)."""
        batch = self.batch
        batch.clear()
        single = [c for c in plan.chunks if c.n_rows == 1]
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
        for c in plan.chunks:
            if c.n_rows > 1:
                tokens = np.asarray([*c.seq.tokens[c.start : c.start + c.length], *c.draft], dtype=np.int32)
                last = batch.add_run(tokens, c.start, c.seq.seq_id, c.wants_logits, n_logits=1 + len(c.draft))
                placed.append((c, last - c.n_rows + 1))
        self._layout = prompt_scores.map_outputs(batch.logits, batch.n_tokens, placed)
        self._n_outputs = batch.n_outputs
        return [c.seq for c, _ in placed if c.wants_logits for _ in range(1 + len(c.draft))]

    @property
    def n_outputs(self) -> int:
        """Rows of the built batch that produce logits: sampling rows and scored prompt rows."""
        return self._n_outputs

    def set_threads(self, n_threads: int) -> None:
        if n_threads != self._threads:
            self.context.set_threads(n_threads)
            self._threads = n_threads

    def decode(self) -> DecodeOutcome:
        return self.context.decode(self.batch)

    def output_logits(self) -> np.ndarray:
        """The sampling rows' logits, in the order build_batch returned their sequences."""
        block = self.context.logits(self._n_outputs)
        return block if self._layout is None else block[self._layout.sampling]

    def record_prompt_scores(self) -> None:
        """Score the prompt rows of the step just decoded (requests with prompt_logprobs)."""
        if self._layout is not None:
            prompt_scores.record(self.context.logits(self._n_outputs), self._layout)

    def import_cells(self, seq_id: int, cells: bytes) -> bool:
        """Give seq_id the KV cells another context exported (False: no room for them)."""
        return self.context.import_sequence(seq_id, cells)

    def close(self) -> None:
        self.context.close()
