"""Per-request sampling parameters, validated once when the request is made."""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from sampling.errors import InvalidParameterError  # what the checks below raise (kept importable here)

LOGIT_BIAS_LIMIT = 100.0
PENALTY_LIMIT = 2.0


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token.

    Per row the sampler applies, in this order:

    1. ``logit_bias``: a sparse map token id -> value in [-100, 100] added to that token's logit
       (OpenAI semantics; -100 effectively bans a token, +100 effectively forces it).
    2. Penalties over the tokens this request has *generated* so far (not the prompt, as in
       OpenAI's API). ``repetition_penalty`` r > 0 (1 disables, llama.cpp / CTRL semantics): a
       seen token's logit is divided by r if positive, multiplied by r otherwise. Then
       ``presence_penalty`` a and ``frequency_penalty`` f in [-2, 2] (0 disables, OpenAI
       semantics): logit -= a * [count > 0] + f * count.
    3. The grammar mask, when the request has one.
    4. ``temperature`` (0 means greedy: the argmax of the edited row), then ``top_k`` (0
       disables), ``top_p`` (1.0 disables; measured on the distribution left by top-k), and
       ``min_p`` (0 disables; keeps tokens with p >= min_p * p_max), as in Hugging Face's and
       OpenAI's order of operations.

    ``seed`` None draws a random seed; the same seed gives the same draws whatever else is in
    the batch, so the same tokens wherever the logits are the same (the step's shape and where
    the sequence's cells lie can move them: docs/evaluation.md).

    ``logit_bias`` may be given as a mapping or as (token, bias) pairs; it is stored as a tuple
    of (int, float) pairs sorted by token id, so the parameters stay frozen and hashable. Token
    ids are checked against the vocabulary by the engine (it knows the vocabulary), not here.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, low=0.0, high=100.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise InvalidParameterError(f"top_k must be an integer, got {self.top_k!r}", field="top_k")
        if self.top_k < 0:
            raise InvalidParameterError(f"top_k must be >= 0 (0 disables it), got {self.top_k}", field="top_k")
        _check_number("top_p", self.top_p, low=0.0, high=1.0)
        if self.top_p == 0.0:
            raise InvalidParameterError("top_p must be > 0 (1.0 disables it), got 0", field="top_p")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0
        ):
            raise InvalidParameterError(f"seed must be a non-negative integer, got {self.seed!r}", field="seed")
        _check_number("min_p", self.min_p, low=0.0, high=1.0)
        _check_number("repetition_penalty", self.repetition_penalty, low=0.0, high=math.inf)
        if not (0.0 < self.repetition_penalty < math.inf):
            raise InvalidParameterError(
                f"repetition_penalty must be a finite number > 0 (1 disables it), got {self.repetition_penalty!r}",
                field="repetition_penalty",
            )
        _check_number("presence_penalty", self.presence_penalty, low=-PENALTY_LIMIT, high=PENALTY_LIMIT)
        _check_number("frequency_penalty", self.frequency_penalty, low=-PENALTY_LIMIT, high=PENALTY_LIMIT)
        object.__setattr__(self, "logit_bias", normalize_logit_bias(self.logit_bias))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )

    @property
    def edits_logits(self) -> bool:
        """Whether logit_bias or a penalty changes the row before the token is picked."""
        return bool(self.logit_bias) or self.has_penalties

    @property
    def truncates(self) -> bool:
        """Whether top-k, top-p or min-p narrows the distribution (false for greedy rows too)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @cached_property
    def logit_bias_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(token ids int64, biases float32) of logit_bias, computed once per params object."""
        ids = np.fromiter((t for t, _ in self.logit_bias), dtype=np.int64, count=len(self.logit_bias))
        values = np.fromiter((b for _, b in self.logit_bias), dtype=np.float32, count=len(self.logit_bias))
        ids.flags.writeable = False
        values.flags.writeable = False
        return ids, values


def _check_number(name: str, value: object, *, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(f"{name} must be a number, got {value!r}", field=name)
    if not (low <= value <= high):  # also rejects NaN
        raise InvalidParameterError(f"{name} must be between {low} and {high}, got {value!r}", field=name)


def normalize_logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
    """logit_bias as (token id, bias) pairs sorted by id, or InvalidParameterError."""
    if bias is None:
        return ()
    if isinstance(bias, Mapping):
        pairs: Iterable = bias.items()
    elif isinstance(bias, (str, bytes)) or not isinstance(bias, Iterable):
        raise InvalidParameterError(
            f"logit_bias must be a mapping of token id to bias (or (id, bias) pairs), got {bias!r}",
            field="logit_bias",
        )
    else:
        pairs = bias
    out: dict[int, float] = {}
    for pair in pairs:
        try:
            token, value = pair
        except (TypeError, ValueError):
            raise InvalidParameterError(f"logit_bias entries must be (token id, bias) pairs, got {pair!r}", field="logit_bias") from None
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise InvalidParameterError(
                f"logit_bias keys must be integer token ids, got {token!r} (convert JSON string keys to int)",
                field="logit_bias",
            )
        if token < 0:
            raise InvalidParameterError(f"logit_bias token ids must be >= 0, got {token}", field="logit_bias")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise InvalidParameterError(f"'logit_bias[{int(token)}]' must be a finite number, got {value!r}", field="logit_bias")
        if not (-LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT):
            raise InvalidParameterError(
                f"'logit_bias[{int(token)}]' must be between -100 and 100, got {value!r}",
                field="logit_bias",
            )
        if int(token) in out:
            raise InvalidParameterError(f"logit_bias lists token {int(token)} twice", field="logit_bias")
        out[int(token)] = float(value)
    return tuple(sorted(out.items()))
