"""What the sampler and grammar need to know about a model's tokens, free of llama.cpp."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenVocabulary:
    """The byte string each token decodes to, and which tokens are not text.

    `token_bytes[i]` is what token i contributes to the output text (empty for control tokens).
    `eog_tokens` end generation; `special_tokens` are control/special tokens that must never be
    produced inside structured text.
    """

    token_bytes: tuple[bytes, ...]
    eog_tokens: frozenset[int]
    special_tokens: frozenset[int] = field(default_factory=frozenset)

    @property
    def size(self) -> int:
        return len(self.token_bytes)
