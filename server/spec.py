"""What one validated HTTP request asks the engine for, whichever API it came through."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from server.structured import StructuredOutput

# Limits the HTTP layer adds to the engine's own (engine.request, sampling.params).
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TEMPERATURE = 2.0  # OpenAI's documented range; higher is noise on a small model
MAX_SEED = 2**63 - 1
MAX_LOGIT_BIAS_ENTRIES = 1024  # bounds the work one request can put on every sampling step
MAX_TIMEOUT_S = 86400.0  # a request deadline; beyond a day it is a mistake, not a deadline


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
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int = 0  # top alternatives per token the engine records; 0: no logprobs at all
    want_logprobs: bool = False  # per-token logprobs are wanted (even with 0 alternatives)
    structured: StructuredOutput | None = None
    extra_stops: tuple[str, ...] = field(default=())  # added by the chat fallback format
    timeout: float | None = None  # seconds from submission, after which it ends with "timeout"
    ignore_eos: bool = False  # generate past end-of-generation tokens (benchmarks; not with JSON)
    open_objects: bool = False  # an absent additionalProperties allows any members (JSON Schema's reading)

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
        # Only what departs from the engine's defaults, so an engine (or a test double) that
        # predates these options still takes plain requests.
        for name, neutral in (("min_p", 0.0), ("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                              ("frequency_penalty", 0.0), ("logit_bias", ())):
            value = getattr(self, name)
            if value != neutral:
                options[name] = value
        if self.timeout is not None:
            options["timeout"] = self.timeout
        if self.ignore_eos:
            options["ignore_eos"] = True
        if self.open_objects:
            options["open_objects"] = True
        if self.want_logprobs:
            # The engine records logprobs only when asked for at least one alternative.
            options["logprobs"] = max(1, self.logprobs)
        if self.structured is not None:
            options.update(self.structured.engine_options())
        return options
