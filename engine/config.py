"""Every engine setting in one place, checked once."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = 8192  # KV cells shared by all sequences (one unified cache)
    max_batch: int = 32  # sequences running at once
    step_token_budget: int = 256  # tokens per llama_decode: decode rows first, then prompt chunks
    n_threads: int = max(1, os.cpu_count() or 1)
    max_waiting: int = 1024  # queued requests before submit() refuses
    swa_full: bool = False
    # With llama.cpp's CPU flash attention, a row's result depends on how many KV cells the
    # whole unified cache holds, so a request's greedy text would change with its neighbours.
    # Off by default: each request's output is then independent of who else is running.
    flash_attn: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < 64:
            raise ValueError(f"n_ctx must be at least 64, got {self.n_ctx}")
        if not 1 <= self.max_batch <= 255:
            raise ValueError(f"max_batch must be between 1 and 255, got {self.max_batch}")
        if self.step_token_budget < self.max_batch:
            raise ValueError(
                "step_token_budget must be at least max_batch, so every running sequence can "
                f"decode each step (got {self.step_token_budget} < {self.max_batch})"
            )
        if self.n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, got {self.n_threads}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
