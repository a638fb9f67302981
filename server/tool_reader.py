"""Reading a tool-calling answer as it is generated: text, or calls in the grammar's format.

server/native_reader.py reads a model's own syntax; its `reader_for` and `spec_reader` pick the
reader.

One reader per choice, fed the text deltas as they come; it yields the pieces both OpenAI's and
Anthropic's streams are made of: a call's start (index, id, name) once its name is complete, then
fragments of its arguments, verbatim.
The streamed response sends those pieces; the non-streamed one joins them, so both carry
exactly the same arguments text. `finish()` checks the whole document (parse, names,
arguments against each function's parameters) before anything is called a tool call.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import jsonschema

from server.errors import InternalError
from server.tools import CALLS_KEY, OPENING, ToolSet

@dataclass
class Call:
    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    fragment: str


Event = Text | CallStart | Arguments

_CALL_HEAD = '{"name":'
_ARGS_HEAD = ',"arguments":'


@dataclass
class ToolOutputReader:
    """mode: "text" (no call possible), "calls" (the output is a calls document), "auto"
    (the first character decides: `{` opens calls, anything else is text) or "format" (an
    output format beside the tools: the output is a calls document if it begins with the
    calls' opening (ToolSet.calls_opening: OPENING here), else the format's document,
    `answer_schema`'s (None: any object), read as text). Call ids
    begin with `id_prefix`: each API has its own (OpenAI's `call_`, Anthropic's `toolu_`)."""

    tools: ToolSet
    mode: str
    id_prefix: str = "call_"
    answer_schema: Mapping[str, Any] | None = None
    calls: list[Call] = field(default_factory=list)
    _text: list[str] = field(default_factory=list)
    _buffer: str = ""  # calls mode: text received and not yet consumed
    _state: str = "opening"
    _depth: int = 0
    _in_string: bool = False
    _escaped: bool = False
    _seen: str = ""  # everything received, for finish()

    @property
    def is_calls(self) -> bool:
        return self.mode == "calls"

    def feed(self, delta: str) -> list[Event]:
        if not delta:
            return []
        self._seen += delta
        if self.mode == "auto":
            self.mode = "calls" if delta[0] == self._opening_char() else self._text_mode()
        if self.mode == "prose":
            return self._prose(delta)
        if self.mode == "format":
            delta = self._decide_format()
            if not delta:
                return []
        if self.mode in ("text", "answer"):
            self._text.append(delta)
            return [Text(delta)]
        self._buffer += delta
        return self._consume()

    def _opening_char(self) -> str:
        """Under auto, the first character that makes the output calls (the grammar's trigger)."""
        return "{"

    def _text_mode(self) -> str:
        """Under auto, the mode of an answer that begins as text: "text" to its end here."""
        return "text"

    def _prose(self, delta: str) -> list[Event]:
        raise NotImplementedError  # only readers of syntaxes whose calls may follow text

    def flush(self) -> list[Event]:
        """Text held back while it could still open calls, once the output has ended."""
        return []

    def _decide_format(self) -> str:
        """Format mode: the grammar (sampling/grammar/either.py) makes an output that begins with
        the calls' opening calls, and any other the format's document; wait until the text shows
        which. The text to read now ("" while undecided: all of it once decided)."""
        opening = self.tools.calls_opening
        if self._seen.startswith(opening):
            self.mode = "calls"
        elif opening.startswith(self._seen):
            return ""
        else:
            self.mode = "answer"
        return self._seen

    def _consume(self) -> list[Event]:
        events: list[Event] = []
        while self._buffer:
            state, buf = self._state, self._buffer
            if state in ("opening", "call", "args_key"):
                literal = {"opening": OPENING, "call": _CALL_HEAD, "args_key": _ARGS_HEAD}[state]
                if len(buf) < len(literal):
                    self._expect(literal.startswith(buf), literal)
                    return events
                self._expect(buf.startswith(literal), literal)
                self._buffer = buf[len(literal):]
                self._state = {"opening": "call", "call": "name", "args_key": "args"}[state]
            elif state == "name":
                end = _string_end(buf)
                if end is None:
                    return events
                call = Call(len(self.calls), f"{self.id_prefix}{uuid.uuid4().hex[:24]}", json.loads(buf[:end]))
                self.calls.append(call)
                events.append(CallStart(call.index, call.id, call.name))
                self._buffer, self._state = buf[end:], "args_key"
            elif state == "args":
                end = self._scan_value(buf)
                piece = buf if end is None else buf[:end]
                if piece:
                    self.calls[-1].arguments += piece
                    events.append(Arguments(self.calls[-1].index, piece))
                if end is None:
                    self._buffer = ""
                    return events
                self._buffer, self._state = buf[end:], "call_end"
            elif state == "call_end":
                self._expect(buf[0] == "}", "}")
                self._buffer, self._state = buf[1:], "between"
            elif state == "between":
                self._expect(buf[0] in ",]", ", or ]")
                self._buffer, self._state = buf[1:], ("call" if buf[0] == "," else "closing")
            elif state == "closing":
                self._expect(buf[0] == "}", "}")
                self._buffer, self._state = buf[1:], "done"
            else:
                self._expect(False, "the end of the document")
        return events

    def _scan_value(self, buf: str) -> int | None:
        """Where the arguments value ends in buf (None: not yet); tracks nesting across feeds."""
        for i, ch in enumerate(buf):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return None

    def _expect(self, ok: bool, what: str) -> None:
        if not ok:  # the grammar writes only this format: anything else is an engine bug
            raise InternalError(f"tool call output is not in the calls format (expected {what!r}): "
                                f"{self._seen[-200:]!r}")

    def content(self) -> str:
        return "".join(self._text)

    def finish(self, stopped: bool) -> list[Call] | None:
        """The complete, valid calls (None: this answer makes no call). `stopped`: the output
        ended by itself (not max_tokens, context, cancellation); only then can calls be whole.
        An answer in the format is checked against it the same way (and is no call)."""
        self.flush()
        if self.mode == "answer" and stopped:
            self._check_answer()
        if self.mode != "calls" or not stopped:
            return None
        if self._state != "done" or self._buffer:
            raise InternalError(f"the calls document ended early: {self._seen[-200:]!r}")
        document = json.loads(self._seen)
        if [c["name"] for c in document[CALLS_KEY]] != [c.name for c in self.calls]:
            raise InternalError("the calls reader and the JSON parser disagree")
        for call, parsed in zip(self.calls, document[CALLS_KEY]):
            if json.loads(call.arguments) != parsed["arguments"]:
                raise InternalError("the calls reader and the JSON parser disagree on arguments")
            check_arguments(self.tools, call.name, parsed["arguments"])
        if not self.calls:
            raise InternalError("a calls document without calls")
        return self.calls


    def _check_answer(self) -> None:
        try:
            document = json.loads(self._seen)
        except json.JSONDecodeError as exc:
            raise InternalError(f"the answer in the output format is not JSON: {exc}") from None
        schema = dict(self.answer_schema) if self.answer_schema is not None else {"type": "object"}
        validator = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
        if error is not None:
            raise InternalError(f"the answer is not valid against the output format: {error.message}")


def check_arguments(tools: ToolSet, name: str, arguments: object) -> None:
    """Raises InternalError unless `name` may be called here with these (parsed) arguments."""
    function = tools.function(name)
    if function is None or function not in tools.callable:
        raise InternalError(f"the output called {name!r}, which may not be called here")
    validator = jsonschema.validators.validator_for(function.parameters)(
        function.parameters, format_checker=jsonschema.FormatChecker())
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        raise InternalError(f"the arguments of {name!r} are not valid against its parameters: {error.message}")


def _string_end(buf: str) -> int | None:
    """The index just past the JSON string that buf starts with (None: not closed yet)."""
    escaped = False
    for i in range(1, len(buf)):
        ch = buf[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            return i + 1
    return None
