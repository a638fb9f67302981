"""Reading a decoded JSON body field by field, with messages that name the field and the problem.

JSON has no separate integer type and Python's bool is an int, so each reader checks the exact
kind it wants: `true` is not a valid max_tokens and `1.5` is not a valid top_k.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable

from starlette.requests import Request

from sampling.params import InvalidParameterError, normalize_logit_bias
from server.errors import BadRequest, PayloadTooLarge

_MISSING = object()


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object, refusing oversized, malformed or non-object bodies."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {max_bytes}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:  # chunked uploads declare no length, so count as it arrives
            raise PayloadTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise BadRequest("request body is empty; send a JSON object")
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # from _reject_constant
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {_json_kind(body)}")
    return body


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; standard JSON (and every sampler range) does not.
    raise ValueError(f"{name} is not a JSON value")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class FieldReader:
    """Takes fields out of a body one at a time; `finish()` refuses whatever was not read."""

    def __init__(self, body: dict[str, Any], where: str = "") -> None:
        self._body = dict(body)
        self._where = where  # prefix for nested objects, e.g. "messages[2]."

    def _name(self, name: str) -> str:
        return f"{self._where}{name}"

    def _take(self, name: str) -> Any:
        return self._body.pop(name, _MISSING)

    def present(self, name: str) -> bool:
        return name in self._body

    def raw(self, name: str, default: Any = None) -> Any:
        value = self._take(name)
        return default if value is _MISSING else value

    def string(
        self,
        name: str,
        default: Any = _MISSING,
        *,
        choices: Iterable[str] | None = None,
        non_empty: bool = False,
        nullable: bool = False,
    ) -> Any:
        value = self._take(name)
        if value is _MISSING or (value is None and nullable):
            if default is _MISSING:
                raise BadRequest(f"'{self._name(name)}' is required", param=self._name(name))
            return default
        if not isinstance(value, str):
            raise BadRequest(
                f"'{self._name(name)}' must be a string, got {_json_kind(value)}", param=self._name(name)
            )
        if non_empty and not value.strip():
            raise BadRequest(f"'{self._name(name)}' must not be empty", param=self._name(name))
        if choices is not None:
            allowed = list(choices)
            if value not in allowed:
                listed = ", ".join(repr(c) for c in allowed)
                raise BadRequest(
                    f"'{self._name(name)}' must be one of {listed}, got {value!r}", param=self._name(name)
                )
        return value

    def integer(
        self,
        name: str,
        default: Any = _MISSING,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        nullable: bool = False,
    ) -> Any:
        value = self._take(name)
        if value is _MISSING or (value is None and nullable):
            if default is _MISSING:
                raise BadRequest(f"'{self._name(name)}' is required", param=self._name(name))
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 16.0 is what some JSON encoders send for 16
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(
                f"'{self._name(name)}' must be an integer, got {_json_kind(value)}", param=self._name(name)
            )
        self._check_range(name, value, minimum, maximum)
        return value

    def number(
        self,
        name: str,
        default: Any = _MISSING,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
        nullable: bool = False,
    ) -> Any:
        value = self._take(name)
        if value is _MISSING or (value is None and nullable):
            if default is _MISSING:
                raise BadRequest(f"'{self._name(name)}' is required", param=self._name(name))
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BadRequest(
                f"'{self._name(name)}' must be a number, got {_json_kind(value)}", param=self._name(name)
            )
        if exclusive_minimum and minimum is not None and value <= minimum:
            raise BadRequest(
                f"'{self._name(name)}' must be greater than {minimum}, got {value}", param=self._name(name)
            )
        self._check_range(name, value, minimum, maximum)
        return float(value)

    def boolean(self, name: str, default: Any = _MISSING, *, nullable: bool = False) -> Any:
        value = self._take(name)
        if value is _MISSING or (value is None and nullable):
            if default is _MISSING:
                raise BadRequest(f"'{self._name(name)}' is required", param=self._name(name))
            return default
        if not isinstance(value, bool):
            raise BadRequest(
                f"'{self._name(name)}' must be true or false, got {_json_kind(value)}", param=self._name(name)
            )
        return value

    def object(self, name: str, default: Any = _MISSING, *, nullable: bool = False) -> Any:
        value = self._take(name)
        if value is _MISSING or (value is None and nullable):
            if default is _MISSING:
                raise BadRequest(f"'{self._name(name)}' is required", param=self._name(name))
            return default
        if not isinstance(value, dict):
            raise BadRequest(
                f"'{self._name(name)}' must be an object, got {_json_kind(value)}", param=self._name(name)
            )
        return value

    def stop_strings(self, name: str = "stop", *, max_count: int, max_length: int) -> tuple[str, ...]:
        """`stop` as OpenAI defines it: null, one string, or a list of strings."""
        value = self._take(name)
        if value is _MISSING or value is None:
            return ()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise BadRequest(
                f"'{name}' must be a string or a list of strings, got {_json_kind(value)}", param=name
            )
        if len(items) > max_count:
            raise BadRequest(f"'{name}' may hold at most {max_count} strings, got {len(items)}", param=name)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise BadRequest(f"'{name}[{i}]' must be a string, got {_json_kind(item)}", param=name)
            if not item:
                raise BadRequest(f"'{name}[{i}]' must not be empty", param=name)
            if len(item) > max_length:
                raise BadRequest(
                    f"'{name}[{i}]' is {len(item)} characters; the limit is {max_length}", param=name
                )
        return tuple(items)

    def logit_bias(self, name: str = "logit_bias", *, max_entries: int) -> tuple[tuple[int, float], ...]:
        """OpenAI's `logit_bias`: an object mapping token ids (JSON keys are strings, so "123")
        to a bias. Only the JSON shape is checked here; the values are checked where the
        parameter is defined (sampling.params.normalize_logit_bias)."""
        value = self._take(name)
        if value is _MISSING or value is None:
            return ()
        full = self._name(name)
        if not isinstance(value, dict):
            raise BadRequest(f"'{full}' must be an object mapping token ids to biases, got {_json_kind(value)}",
                             param=full)
        if len(value) > max_entries:
            raise BadRequest(f"'{full}' may hold at most {max_entries} entries, got {len(value)}", param=full)
        for key, bias in value.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit()):
                raise BadRequest(f"'{full}' keys must be non-negative integer token ids, got {key!r}", param=full)
            if isinstance(bias, bool) or not isinstance(bias, (int, float)):
                raise BadRequest(f"'{full}[{key}]' must be a number, got {_json_kind(bias)}", param=full)
        try:
            return normalize_logit_bias([(int(key), bias) for key, bias in value.items()])
        except InvalidParameterError as exc:
            raise BadRequest(str(exc), param=full) from None

    def finish(self) -> None:
        """Refuse unknown fields: a misspelt option silently ignored is worse than an error."""
        if self._body:
            names = ", ".join(repr(self._name(k)) for k in sorted(self._body))
            raise BadRequest(f"unknown field(s): {names}", param=self._name(sorted(self._body)[0]))

    def _check_range(
        self, name: str, value: float, minimum: float | None, maximum: float | None
    ) -> None:
        full = self._name(name)
        if minimum is not None and value < minimum:
            raise BadRequest(f"'{full}' must be >= {minimum}, got {value}", param=full)
        if maximum is not None and value > maximum:
            raise BadRequest(f"'{full}' must be <= {maximum}, got {value}", param=full)
