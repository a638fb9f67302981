"""llama-cpp-python's high-level `Llama` class: what its users run today, one request at a time.

Used only as the sequential baseline of bench/sequential.py and as the reference the prompt-logprob
tests compare with; the engine never touches it.
"""
from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np

import llama_cpp
import llama_cpp.llama_cpp as llama_c_api

from bindings.library import model_params


class SequentialLlama:
    def __init__(self, model_path: str | Path, n_ctx: int = 4096, n_threads: int = 2) -> None:
        # `Llama` takes no model parameter for extra buffer types: hand it ours (bindings/library.py).
        with mock.patch.object(llama_c_api, "llama_model_default_params", model_params):
            self._llama = llama_cpp.Llama(
                model_path=str(model_path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                verbose=False,
            )

    def complete(self, prompt: str, max_tokens: int, banned_tokens: frozenset[int] = frozenset(),
                 **sampling: float | int) -> int:
        """Run one completion to the end; returns how many tokens it generated. `banned_tokens`
        (end-of-generation tokens, say) get a large negative bias, so every request does the
        same amount of work as the engine's ignore_eos requests."""
        out = self._llama.create_completion(
            prompt, max_tokens=max_tokens, logit_bias={t: -1e4 for t in banned_tokens} or None, **sampling
        )
        return int(out["usage"]["completion_tokens"])

    def close(self) -> None:
        self._llama.close()


class ReferenceScorer:
    """`Llama(logits_all=True)`: every prompt row's logits from llama-cpp-python's own path, one
    prompt at a time in a fresh cache. The tests check the engine's prompt logprobs against it."""

    def __init__(self, model_path: str | Path, n_ctx: int = 1024, n_threads: int = 2,
                 flash_attn: bool = False, n_batch: int = 512) -> None:
        # scores holds n_ctx rows of the whole vocabulary: keep n_ctx no larger than the prompts need.
        with mock.patch.object(llama_c_api, "llama_model_default_params", model_params):
            self._llama = llama_cpp.Llama(
                model_path=str(model_path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                logits_all=True, flash_attn=flash_attn, n_batch=n_batch, n_ubatch=n_batch, verbose=False,
            )

    def prompt_logits(self, tokens: list[int]) -> np.ndarray:
        """One row of logits per prompt token (row i predicts token i + 1), float32, a copy."""
        self._llama.reset()
        self._llama.eval(tokens)
        return np.array(self._llama.scores[: len(tokens)], dtype=np.float32)

    def close(self) -> None:
        self._llama.close()
