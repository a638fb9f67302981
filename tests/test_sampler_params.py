"""SamplingParams validation: every field, with the field named in the error."""
import math

import numpy as np
import pytest

from sampling.params import InvalidParameterError, SamplingParams


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1}, {"temperature": float("nan")}, {"temperature": "hot"}, {"temperature": 101},
        {"top_k": -1}, {"top_k": 2.5}, {"top_k": True},
        {"top_p": 0}, {"top_p": 1.5}, {"top_p": float("nan")},
        {"seed": -3}, {"seed": 1.5}, {"seed": True},
        {"min_p": -0.1}, {"min_p": 1.01}, {"min_p": float("nan")}, {"min_p": "0.1"},
        {"repetition_penalty": 0}, {"repetition_penalty": -1.0}, {"repetition_penalty": math.inf},
        {"repetition_penalty": float("nan")}, {"repetition_penalty": None},
        {"presence_penalty": 2.5}, {"presence_penalty": -2.01}, {"presence_penalty": float("nan")},
        {"frequency_penalty": -3}, {"frequency_penalty": 2.0001}, {"frequency_penalty": False},
        {"logit_bias": {"5": 1.0}}, {"logit_bias": {True: 1.0}}, {"logit_bias": {-1: 1.0}},
        {"logit_bias": {5: math.inf}}, {"logit_bias": {5: float("nan")}}, {"logit_bias": {5: 100.5}},
        {"logit_bias": {5: -101}}, {"logit_bias": {5: "1"}}, {"logit_bias": {5: True}},
        {"logit_bias": [(5, 1.0), (5, 2.0)]}, {"logit_bias": [5, 6]}, {"logit_bias": "abc"},
        {"logit_bias": 3}, {"logit_bias": {2.0: 1.0}},
    ],
)
def test_invalid_parameters_are_rejected_with_their_name(kwargs):
    with pytest.raises(InvalidParameterError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_valid_edges_are_accepted():
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=0.0, seed=0)
    SamplingParams(min_p=1.0, repetition_penalty=1e-3, presence_penalty=-2, frequency_penalty=2)
    SamplingParams(logit_bias={np.int64(3): -100, 4: 100.0, 0: np.float32(0.5)})


def test_logit_bias_is_normalised_frozen_and_hashable():
    a = SamplingParams(temperature=1.0, logit_bias={9: 1, 2: -3.5})
    b = SamplingParams(temperature=1.0, logit_bias=[(2, -3.5), (9, 1.0)])
    assert a.logit_bias == ((2, -3.5), (9, 1.0))
    assert all(type(t) is int and type(v) is float for t, v in a.logit_bias)
    assert a == b and hash(a) == hash(b)
    assert SamplingParams(logit_bias=None).logit_bias == ()
    ids, values = a.logit_bias_arrays
    assert ids.tolist() == [2, 9] and values.tolist() == [-3.5, 1.0]
    with pytest.raises(ValueError):
        ids[0] = 5  # the cached arrays are read-only
    with pytest.raises(AttributeError):
        a.top_k = 3


def test_derived_flags():
    assert SamplingParams().is_greedy and SamplingParams(temperature=1, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.5).truncates
    assert SamplingParams(temperature=0.5, min_p=0.1).truncates
    assert SamplingParams(presence_penalty=0.1).edits_logits
    assert SamplingParams(logit_bias={1: 1}).edits_logits
    assert not SamplingParams(repetition_penalty=1.0).has_penalties
