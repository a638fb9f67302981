"""Each entry point's sampling defaults, defined once.

Three entry points, three sets of defaults, on purpose: the Python `Engine` is greedy (its
outputs reproducible by default), `/generate` samples as llama.cpp's examples do, and the
OpenAI routes follow OpenAI's documented defaults so its clients behave as they expect.
docs/http-api.md ("Sampling defaults") shows `defaults_table()`; a test keeps the two equal.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from engine.request import Request
from sampling.params import SamplingParams


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request gets for each field it leaves out (the neutral ones are the engine's)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float = SamplingParams.min_p
    repetition_penalty: float = SamplingParams.repetition_penalty
    presence_penalty: float = SamplingParams.presence_penalty
    frequency_penalty: float = SamplingParams.frequency_penalty
    seed: int | None = SamplingParams.seed  # None: a random seed per request


ENGINE = SamplingDefaults(max_tokens=Request.max_tokens, temperature=SamplingParams.temperature,
                          top_p=SamplingParams.top_p, top_k=SamplingParams.top_k)
GENERATE = SamplingDefaults(max_tokens=512, temperature=0.7, top_p=0.9, top_k=40)
COMPLETIONS = SamplingDefaults(max_tokens=16, temperature=1.0, top_p=1.0, top_k=0)  # OpenAI's
CHAT = replace(COMPLETIONS, max_tokens=512)  # OpenAI's is "until the context is full"; 512 bounds it

ENTRY_POINTS: dict[str, SamplingDefaults] = {
    "Python `Engine.submit`": ENGINE,
    "`POST /generate`": GENERATE,
    "`POST /v1/completions`": COMPLETIONS,
    "`POST /v1/chat/completions`": CHAT,
}


def defaults_table() -> str:
    """The markdown table docs/http-api.md shows: one row per parameter, one column per entry point."""
    lines = ["| parameter | " + " | ".join(ENTRY_POINTS) + " |", "| --- |" + " --- |" * len(ENTRY_POINTS)]
    for f in fields(SamplingDefaults):
        cells = [_cell(getattr(d, f.name)) for d in ENTRY_POINTS.values()]
        lines.append(f"| `{f.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "random"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"{value:g}" if isinstance(value, float) else str(value)
