"""What a client asks for and what it gets back."""
from __future__ import annotations

import enum
import hashlib
import itertools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import jsonschema

from sampling.errors import InvalidParameterError
from sampling.grammar.framed import TextFrame
from sampling.params import SamplingParams

_request_ids = itertools.count(1)

MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's chat limit too)


class Priority(str, enum.Enum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # an end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens reached
    CONTEXT_LENGTH = "context_length"  # the sequence filled the model's context
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    ERROR = "error"


class JsonSchema(Mapping[str, Any]):
    """A JSON Schema object that jsonschema's validators accept: the one check of a request's
    schema, made when the schema becomes a JsonSchema. A Request turns its json_schema into one,
    and the HTTP routes do it when they read the field, so a schema is checked once on either
    path and refused with the same message. What the grammar compiler cannot express (an
    unsupported keyword) is the compiler's to refuse, at submit."""

    def __init__(self, schema: Any, name: str = "json_schema") -> None:
        """Raises InvalidParameterError (field "json_schema") saying what is wrong; `name` is the
        field as the caller knows it, for the message."""
        if isinstance(schema, Mapping) and not isinstance(schema, dict):
            schema = dict(schema)
        problem = _schema_problem(schema)
        if problem is not None:
            raise InvalidParameterError(f"'{name}' {problem}", field="json_schema")
        self._schema: dict[str, Any] = schema

    @classmethod
    def assembled(cls, schema: dict[str, Any]) -> "JsonSchema":
        """A schema the caller built around JsonSchemas it made, in a frame valid by construction
        (tool calls: server/tools.py, whose tests check the frame): not checked again."""
        made = cls.__new__(cls)
        made._schema = schema
        return made

    def __getitem__(self, key: str) -> Any:
        return self._schema[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._schema)

    def __len__(self) -> int:
        return len(self._schema)

    def __repr__(self) -> str:
        return f"JsonSchema({self._schema!r})"


# Digests of the schemas found valid most recently: the check takes milliseconds (tens for a
# large schema; measured with jsonschema 4 on this machine), and clients send the same schema
# again and again. Client threads make Requests, so it is shared by them, under its lock.
_VALID_SCHEMAS: OrderedDict[bytes, None] = OrderedDict()
_VALID_SCHEMAS_KEPT = 1024
_valid_schemas_lock = threading.Lock()


def _schema_problem(schema: Any) -> str | None:
    """What makes `schema` no JSON Schema object, said after the field's name; None if nothing."""
    if isinstance(schema, bool):
        return "must be a JSON Schema object (boolean schemas are not supported)"
    if not isinstance(schema, dict):
        return "must be a JSON Schema object"
    try:
        digest: bytes | None = hashlib.sha256(json.dumps(schema, separators=(",", ":")).encode()).digest()
    except (TypeError, ValueError):  # not JSON: checked every time (and the compiler refuses it)
        digest = None
    with _valid_schemas_lock:
        if digest in _VALID_SCHEMAS:
            _VALID_SCHEMAS.move_to_end(digest)
            return None
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"is not a valid JSON Schema at {where}: {exc.message}"
    except Exception as exc:  # e.g. an unknown $schema dialect URI
        return f"is not a valid JSON Schema: {exc}"
    if digest is not None:
        with _valid_schemas_lock:
            _VALID_SCHEMAS[digest] = None
            if len(_VALID_SCHEMAS) > _VALID_SCHEMAS_KEPT:
                _VALID_SCHEMAS.popitem(last=False)
    return None


@dataclass(frozen=True)
class JsonAlternative:
    """What else a JSON output may be: a document of `schema` (None: any JSON object), unless it
    begins with `opening`, which only json_schema's documents (or tool_frame's calls) then are
    (sampling/grammar/either.py). Tool calling's "auto" beside an output format: calls or the
    format's document. With a tool_frame, `opening` is the text every call begins with (after
    the frame's opening special token, which opens the calls too)."""

    schema: Mapping[str, Any] | None
    opening: str

    def __post_init__(self) -> None:
        if self.schema is not None and not isinstance(self.schema, JsonSchema):
            object.__setattr__(self, "schema", JsonSchema(self.schema, name="json_alternative.schema"))
        if not isinstance(self.opening, str) or not self.opening:
            raise InvalidParameterError("json_alternative.opening must be a non-empty string",
                                        field="json_alternative")


@dataclass(frozen=True)
class Request:
    """One generation request. `prompt` is text, or token ids used as they are."""

    prompt: str | Sequence[int]
    max_tokens: int = 512
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    priority: Priority = Priority.BATCH
    add_bos: bool = True
    ignore_eos: bool = False  # keep going past end-of-generation tokens (benchmarks)
    # "json" constrains the output to JSON: to `json_schema` when given, else to any object.
    format: str = "raw"
    json_schema: Mapping[str, Any] | None = None  # checked once: held as a JsonSchema
    # What an absent `additionalProperties` means in json_schema: False (the default, as in
    # OpenAI's strict mode) allows no members beyond the named ones; True follows JSON Schema.
    open_objects: bool = False
    # With format "json": the output may instead be free text that does not begin like the
    # document; the first token decides (sampling/grammar/trigger.py). Tool calling's "auto".
    json_or_text: bool = False
    # Tool calls in the model's own syntax (sampling/grammar/framed.py) instead of a JSON document:
    # format "json" is then the frame's grammar (json_schema stays None; structured_data too).
    tool_frame: TextFrame | None = None
    # With format "json": the output may instead be the alternative's document (JsonAlternative).
    json_alternative: JsonAlternative | None = None
    logprobs: int = 0  # with n > 0, each generated token's logprob and the n most likely
    # Not None: score the prompt too, each token's logprob given those before it and this many
    # most likely alternatives (evaluation). The prompt is then computed in full, never taken from
    # the prefix cache, and max_tokens may be 0 (score only, generate nothing).
    prompt_logprobs: int | None = None
    # Seconds from submission after which the request finishes with TIMEOUT, whatever its
    # state (waiting, prefilling, decoding, preempted), keeping what it has generated.
    timeout: float | None = None
    request_id: str = field(default_factory=lambda: f"req-{next(_request_ids)}")
    # False: never verify drafted tokens for it (engine/speculation.py); its output is the same
    # either way, token for token under greedy decoding, in distribution when sampling.
    speculative: bool = True
    # Whose finished outputs may propose drafts for it (engine/drafts.py): requests of one
    # scope only, so one client's text is never guessed for another's (the server sets the key).
    draft_scope: str = ""
    # Who sent it (engine/fair_share.py): within its tier, the backlogged tenant with the least
    # service per unit of weight is admitted first. "" is the one tenant of a server without keys.
    tenant: str = ""
    weight: float = 1.0  # this tenant's share relative to others' (3 against 1: three times the tokens)

    def __post_init__(self) -> None:
        if isinstance(self.prompt, str):
            if not self.prompt:
                raise InvalidParameterError("prompt must not be empty", field="prompt")
        else:
            ids = tuple(self.prompt)
            if not ids:
                raise InvalidParameterError("prompt must not be empty", field="prompt")
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise InvalidParameterError("prompt token ids must be non-negative integers", field="prompt")
            object.__setattr__(self, "prompt", ids)
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidParameterError(f"max_tokens must be an integer, got {self.max_tokens!r}", field="max_tokens")
        if self.prompt_logprobs is not None and (
                isinstance(self.prompt_logprobs, bool) or not isinstance(self.prompt_logprobs, int)
                or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise InvalidParameterError(f"prompt_logprobs must be null or an integer from 0 to {MAX_LOGPROBS}, "
                                        f"got {self.prompt_logprobs!r}", field="prompt_logprobs")
        least = 0 if self.prompt_logprobs is not None else 1  # 0 tokens only makes sense when scoring
        if self.max_tokens < least:
            raise InvalidParameterError(f"max_tokens must be >= {least}, got {self.max_tokens}"
                                        + ("" if least == 0 else " (0 only with prompt_logprobs)"),
                                        field="max_tokens")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidParameterError("stop must be a list of non-empty strings", field="stop")
        object.__setattr__(self, "stop", stop)
        if isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidParameterError(
                f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {self.logprobs!r}", field="logprobs"
            )
        if self.format not in ("raw", "json"):
            raise InvalidParameterError(f"format must be 'raw' or 'json', got {self.format!r}", field="format")
        if self.json_schema is not None:
            if not isinstance(self.json_schema, JsonSchema):
                object.__setattr__(self, "json_schema", JsonSchema(self.json_schema))
            object.__setattr__(self, "format", "json")
        if not isinstance(self.open_objects, bool):
            raise InvalidParameterError(f"open_objects must be true or false, got {self.open_objects!r}",
                                        field="open_objects")
        if self.open_objects and self.json_schema is None:
            raise InvalidParameterError("open_objects applies to a json_schema; none was given", field="open_objects")
        if self.tool_frame is not None:
            if not isinstance(self.tool_frame, TextFrame):
                raise InvalidParameterError("tool_frame must be a TextFrame", field="tool_frame")
            if self.json_schema is not None:
                raise InvalidParameterError("tool_frame replaces json_schema; give one", field="tool_frame")
            object.__setattr__(self, "format", "json")
        if not isinstance(self.json_or_text, bool):
            raise InvalidParameterError(f"json_or_text must be true or false, got {self.json_or_text!r}",
                                        field="json_or_text")
        if self.json_or_text and self.format != "json":
            raise InvalidParameterError("json_or_text applies to JSON output; none was asked for", field="json_or_text")
        if self.json_alternative is not None:
            if not isinstance(self.json_alternative, JsonAlternative):
                raise InvalidParameterError("json_alternative must be a JsonAlternative", field="json_alternative")
            if self.format != "json" or self.json_or_text:
                raise InvalidParameterError("json_alternative is another JSON document than json_schema's: it "
                                            "needs format \"json\" and no json_or_text", field="json_alternative")
            frame, opening = self.tool_frame, self.json_alternative.opening
            if frame is not None and not all((frame.opening + c.head).startswith(opening) for c in frame.calls):
                raise InvalidParameterError("json_alternative.opening must be how every call of the tool_frame "
                                            "begins", field="json_alternative")
        if self.format == "json" and stop:
            raise InvalidParameterError("stop strings cannot be combined with JSON output: they would cut it", field="stop")
        if self.timeout is not None:
            if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not (
                0 < self.timeout < float("inf")
            ):
                raise InvalidParameterError(f"timeout must be a positive number of seconds, got {self.timeout!r}", field="timeout")
        if not isinstance(self.speculative, bool):
            raise InvalidParameterError(f"speculative must be true or false, got {self.speculative!r}",
                                        field="speculative")
        if not isinstance(self.draft_scope, str):
            raise InvalidParameterError("draft_scope must be a string", field="draft_scope")
        if not isinstance(self.tenant, str):
            raise InvalidParameterError("tenant must be a string", field="tenant")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not (
                0 < self.weight < float("inf")):
            raise InvalidParameterError(f"weight must be a positive number, got {self.weight!r}", field="weight")
        try:
            object.__setattr__(self, "priority", Priority(self.priority))
        except ValueError:
            raise InvalidParameterError(
                f"priority must be 'interactive' or 'batch', got {self.priority!r}",
                field="priority",
            ) from None


@dataclass(frozen=True)
class RequestMetrics:
    """Measured for one request, in milliseconds from its submission.

    generation_time_ms runs from admission (first scheduled) to finish, so it covers prefill and
    decode; tokens_per_second is tokens_generated over that time.
    """

    prompt_tokens: int
    tokens_generated: int
    queue_time_ms: float
    ttft_ms: float | None
    generation_time_ms: float
    latency_ms: float
    tokens_per_second: float
    cached_tokens: int = 0
    # Engine steps (llama_decode calls, interrupted ones included) from the first step after
    # submission to the one that produced the first token: 1 means the very next step.
    ttft_steps: int | None = None
    preemptions: int = 0  # times it gave up its KV cells and recomputed them
    suspensions: int = 0  # times it gave up its slot to an interactive request, keeping its KV
    forced_tokens: int = 0  # of tokens_generated, appended unsampled where the grammar allowed one continuation
    # Between consecutive steps that gave it tokens (the first token's wait is ttft_ms).
    inter_token_ms: tuple[float, ...] = ()
    first_token_from_lane: bool = False  # its first token came from the first-token lane, beside the step in flight
    drafted_tokens: int = 0  # tokens guessed ahead for it and checked by the model (speculative decoding)
    accepted_tokens: int = 0  # of those, the ones the model agreed with: each saved it a step


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    metrics: RequestMetrics
    error: str | None = None
    structured_data: Any = None  # the parsed JSON document, for format "json"
    logprobs: tuple[Any, ...] | None = None  # TokenLogprob per generated token, when asked
    # With prompt_logprobs: the prompt's token ids, and a TokenLogprob for each (None for the first).
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_logprobs: tuple[Any, ...] | None = None
    stop_string: str | None = None  # the stop string that ended it (None: anything else did)
