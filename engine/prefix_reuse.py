"""Whether idle cached prefixes are worth what a prefill pays for them.

llama.cpp's attention reads the mask of every used cell of the unified cache for every prompt
row, so idle cached cells slow each prompt token a little, and a long prompt that found nothing
in the cache pays that on all its tokens (docs/kv-cache.md has the measurement). What keeping
them is worth depends on how often the cache is hit, which this rule measures: the share of
recent prompt tokens the cache served. When a prompt arrives, and when a finished sequence leaves
idle cells while prompts are still prefilling, the rule says whether to keep the idle cells
through the prompt tokens left (the cost per idle cell is linear in them, so all or none).
"""
from __future__ import annotations

from engine.ownership import SingleWriter
from engine.tuning import REUSE_HALF_LIFE_TOKENS, REUSE_PRIOR_SHARE, REUSE_PRIOR_TOKENS

class PrefixReuse(SingleWriter):
    """Engine thread only (the KV cache's)."""

    def __init__(self, prompt_token_in_idle_cells: float, half_life_tokens: float = REUSE_HALF_LIFE_TOKENS) -> None:
        self.prompt_token_in_idle_cells = prompt_token_in_idle_cells
        self.half_life_tokens = half_life_tokens
        self._served = REUSE_PRIOR_SHARE * REUSE_PRIOR_TOKENS
        self._asked = float(REUSE_PRIOR_TOKENS)

    @property
    def share(self) -> float:
        """Decayed share of recent prompt tokens served from the cache."""
        return self._served / self._asked

    def observe(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A prompt was admitted; the cache served its first `cached_tokens`."""
        decay = 0.5 ** (prompt_tokens / self.half_life_tokens)
        self._served = self._served * decay + cached_tokens
        self._asked = self._asked * decay + prompt_tokens

    def keep_idle(self, fresh_tokens: int) -> bool:
        """Keep idle cached cells while `fresh_tokens` prompt tokens prefill? Each idle cell costs
        fresh_tokens mask reads and is worth a prefilled token with the measured hit share."""
        return fresh_tokens <= self.share * self.prompt_token_in_idle_cells
