"""Per-request sampling parameters, validated once when the request is made."""
from __future__ import annotations

from dataclasses import dataclass


class InvalidParameterError(ValueError):
    """A request parameter is out of range or of the wrong type; the message says which."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token.

    temperature 0 means greedy. top_k 0 and top_p 1.0 disable those cuts. Temperature is applied
    before top-k / top-p, as in OpenAI's and Hugging Face's samplers. seed None draws a random
    seed; the same seed, prompt and batch composition give the same tokens.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, low=0.0, high=100.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise InvalidParameterError(f"top_k must be an integer, got {self.top_k!r}")
        if self.top_k < 0:
            raise InvalidParameterError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        _check_number("top_p", self.top_p, low=0.0, high=1.0)
        if self.top_p == 0.0:
            raise InvalidParameterError("top_p must be > 0 (1.0 disables it), got 0")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0
        ):
            raise InvalidParameterError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _check_number(name: str, value: object, *, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameterError(f"{name} must be a number, got {value!r}")
    if not (low <= value <= high):  # also rejects NaN
        raise InvalidParameterError(f"{name} must be between {low} and {high}, got {value!r}")
