"""What one validated HTTP request asks the engine for, whichever API it came through."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from server.structured import StructuredOutput

# Limits the HTTP layer enforces before anything reaches the engine.
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TEMPERATURE = 2.0  # OpenAI's documented range; higher is noise on a small model
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class GenerationSpec:
    prompt: str | Sequence[int]  # text, or token ids already rendered (chat)
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    priority: str
    stream: bool
    structured: StructuredOutput | None = None
    extra_stops: tuple[str, ...] = field(default=())  # added by the chat fallback format

    def engine_options(self) -> dict[str, Any]:
        """Keyword arguments for Engine.submit (besides the prompt)."""
        options: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": tuple(dict.fromkeys(self.stop + self.extra_stops)),
            "priority": self.priority,
        }
        if self.structured is not None:
            options.update(self.structured.engine_options())
        return options
