"""Every refusal derives from RequestError, is listed once (engine.REFUSALS), and has an HTTP status."""
from __future__ import annotations

import pytest

import engine
from engine import REFUSALS, InvalidParameterError, PromptTooLongError, RequestError, SamplingParams
from server.errors import APIError
from server.generation import refusal_error
from server.schemas import parse_generate


def _all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


def test_the_refusal_list_is_every_request_error():
    listed = set(REFUSALS.values())
    assert all(issubclass(cls, RequestError) for cls in listed)
    defined = {c for c in _all_subclasses(RequestError) if c.__module__ in ("sampling.errors", "engine.errors")}
    assert defined == listed
    assert all(name == cls.__name__ for name, cls in REFUSALS.items())


def test_engine_exports_each_refusal_and_the_base():
    for name, cls in REFUSALS.items():
        assert getattr(engine, name) is cls and name in engine.__all__
    assert engine.RequestError is RequestError


def test_parameter_errors_stay_value_errors():
    # Callers that validate arguments catch ValueError; a refusal must still be one.
    assert issubclass(InvalidParameterError, ValueError) and issubclass(PromptTooLongError, ValueError)
    with pytest.raises(RequestError) as info:
        SamplingParams(top_p=0.0)
    assert isinstance(info.value, InvalidParameterError) and info.value.field == "top_p"


_SPEC = parse_generate({"prompt": "x"}, n_ctx=64)[0]


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_every_refusal_has_its_http_error(name):
    error = refusal_error(REFUSALS[name]("refused"), _SPEC)
    assert isinstance(error, APIError) and (400 <= error.status_code < 500 or error.status_code == 503)
    assert "refused" in error.message


def test_refusal_statuses():
    statuses = {name: refusal_error(cls("no"), _SPEC).status_code for name, cls in REFUSALS.items()}
    assert statuses == {"InvalidParameterError": 400, "PromptTooLongError": 400, "QueueFullError": 429,
                        "EngineClosedError": 503}
    named = refusal_error(InvalidParameterError("bad", field="top_k"), _SPEC)
    assert named.param == "top_k"


def test_an_unlisted_refusal_is_a_bug_not_a_silent_500():
    class Unlisted(RequestError):
        pass

    with pytest.raises(TypeError, match="Unlisted"):
        refusal_error(Unlisted("x"), _SPEC)


def test_a_too_small_budget_says_how_many_tokens_would_do_even_after_pickling():
    import pickle

    from engine import InvalidParameterError

    exc = pickle.loads(pickle.dumps(InvalidParameterError("too small", field="max_tokens", needed_tokens=7)))
    assert (exc.field, exc.needed_tokens, str(exc)) == ("max_tokens", 7, "too small")
