"""Reading tool calls written in a model's own syntax (server/tool_syntax.py) as they stream.

The same pieces as the generic reader (server/tool_reader.py): a call's start once its name is
complete, then fragments of its arguments, verbatim; `finish()` checks the whole answer against
the syntax (rebuilt from the calls read, it must be the text received) and each call's arguments
against its function's parameters. In "auto" mode the first character decides, as the grammar's
trigger does: the syntax's opening character opens calls, anything else is text; for a family
that writes text before its calls, that text is "prose", watched for the calls' marker as the
grammar watches it, and the calls read from there (the text before is the content). In "format"
mode (a JSON output format beside the tools) the syntax's whole start decides, as the grammar's
EitherMatcher does: calls, or the format's document. A syntax whose calls open with a special
token (no text) is read from the text after it.
"""
from __future__ import annotations

import json
import secrets
import string
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from server.errors import InternalError
from server.tool_reader import Arguments, Call, CallStart, Event, Text, ToolOutputReader, check_arguments
from server.tools import ToolSet

if TYPE_CHECKING:
    from server.spec import GenerationSpec

_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_ID_ALPHABET = string.ascii_letters + string.digits


def reader_for(tools: ToolSet, mode: str, id_prefix: str = "call_",
               answer_schema: Mapping[str, Any] | None = None) -> ToolOutputReader:
    """The reader for the syntax the tools are written in: generic, or the model's own."""
    if tools.syntax.is_generic:
        return ToolOutputReader(tools, mode, id_prefix, answer_schema)
    return NativeReader(tools, mode, id_prefix, answer_schema)


def spec_reader(spec: "GenerationSpec", id_prefix: str = "call_") -> ToolOutputReader:
    """The reader of a spec that calls tools (spec.calls_tools): "calls" under required or a named
    function, "auto" (calls or text), or "format" (calls or the answer_format's document)."""
    assert spec.tools is not None
    if not spec.may_answer_in_text:
        return reader_for(spec.tools, "calls", id_prefix)
    if spec.answer_format is None:
        return reader_for(spec.tools, "auto", id_prefix)
    return reader_for(spec.tools, "format", id_prefix, spec.answer_format.schema)


@dataclass
class NativeReader(ToolOutputReader):
    _model_ids: list[str] = field(default_factory=list)  # ids the model wrote (Mistral), in order
    _held: str = ""  # prose: text that may still be the start of the calls' marker
    _calls_from: int = 0  # where in the output the calls begin (after text, in prose)

    def _opening_char(self) -> str:
        return self.tools.syntax.start[0]

    def _text_mode(self) -> str:
        return "prose" if self.tools.syntax.calls_after_text else "text"

    def _prose(self, delta: str) -> list[Event]:
        """Text that calls may follow: where it first holds the marker (as the grammar watches
        it), the calls begin; the template's joint before them is no part of the content."""
        s = self.tools.syntax
        held = self._held + delta
        at = held.find(s.marker)
        if at < 0:
            keep = _longest_start(held, (s.text_joint + s.marker, s.marker))
            self._held = held[len(held) - keep:]
            return self._text_event(held[:len(held) - keep])
        before = held[:at]
        if s.text_joint and before.endswith(s.text_joint):
            before = before[:len(before) - len(s.text_joint)]
        events = self._text_event(before)
        self._held, self._buffer, self.mode = "", held[at:], "calls"
        self._calls_from = len(self._seen) - len(self._buffer)
        return events + self._consume()

    def _text_event(self, text: str) -> list[Event]:
        if not text:
            return []
        self._text.append(text)
        return [Text(text)]

    def flush(self) -> list[Event]:
        held, self._held = self._held, ""
        return self._text_event(held) if self.mode == "prose" else []

    def _new_id(self) -> str:
        s = self.tools.syntax
        if s.id_length:  # the template checks the id's shape when the call is echoed back
            return "".join(secrets.choice(_ID_ALPHABET) for _ in range(s.id_length))
        return f"{self.id_prefix}{uuid.uuid4().hex[:24]}"

    def _literal(self, literal: str, next_state: str) -> bool:
        """Consume `literal` from the buffer (False: not all of it has arrived)."""
        buf = self._buffer
        if len(buf) < len(literal):
            self._expect(literal.startswith(buf), literal)
            return False
        self._expect(buf.startswith(literal), literal)
        self._buffer, self._state = buf[len(literal):], next_state
        return True

    def _consume(self) -> list[Event]:
        s = self.tools.syntax
        events: list[Event] = []
        tail_before, tail_after = s.call_tail[:s.id_at], s.call_tail[s.id_at:]
        while self._buffer or self._state in ("opening", "head", "name_to_args", "tail", "tail_after"):
            state, buf = self._state, self._buffer
            if state == "opening":
                if not self._literal(s.opening, "head"):
                    return events
            elif state == "head":
                if not self._literal(s.call_head, "name"):
                    return events
            elif state == "name":
                end = next((i for i, ch in enumerate(buf) if ch not in _NAME_CHARS), None)
                if end is None:
                    return events
                self._expect(end > 0, "a function name")
                call = Call(len(self.calls), self._new_id(), buf[:end])
                self.calls.append(call)
                events.append(CallStart(call.index, call.id, call.name))
                self._buffer, self._state = buf[end:], "name_to_args"
            elif state == "name_to_args":
                if not self._literal(s.name_to_args, "args"):
                    return events
            elif state == "args":
                end = self._scan_value(buf)
                piece = buf if end is None else buf[:end]
                if piece:
                    self.calls[-1].arguments += piece
                    events.append(Arguments(self.calls[-1].index, piece))
                if end is None:
                    self._buffer = ""
                    return events
                self._buffer, self._state = buf[end:], "tail"
            elif state == "tail":
                if not self._literal(tail_before, "id" if s.id_length else "tail_after"):
                    return events
            elif state == "id":
                if len(buf) < s.id_length:
                    return events
                self._model_ids.append(buf[:s.id_length])
                self._buffer, self._state = buf[s.id_length:], "tail_after"
            elif state == "tail_after":
                if not self._literal(tail_after, "between"):
                    return events
            elif state == "between":
                more, done = s.separator + s.call_head, s.closing
                if s.parallel and buf.startswith(more):
                    self._buffer, self._state = buf[len(more):], "name"
                elif done and buf.startswith(done):
                    self._buffer, self._state = buf[len(done):], "done"
                else:  # wait while the buffer could still become either
                    self._expect((s.parallel and more.startswith(buf)) or done.startswith(buf),
                                 "another call or the end")
                    return events
            else:
                self._expect(False, "the end of the calls")
        return events

    def finish(self, stopped: bool) -> list[Call] | None:
        self.flush()
        if self.mode == "answer" and stopped:
            self._check_answer()
        if self.mode != "calls" or not stopped:
            return None
        s = self.tools.syntax
        ended = self._state == "done" or (self._state == "between" and not self._buffer and not s.closing)
        if not ended or self._buffer or not self.calls:
            raise InternalError(f"the calls ended early: {self._seen[-200:]!r}")
        ids = self._model_ids or [""] * len(self.calls)
        rebuilt = s.calls_text([(c.name, c.arguments, i) for c, i in zip(self.calls, ids)])
        if rebuilt != self._seen[self._calls_from:]:
            raise InternalError("the calls reader misread the calls")
        for call in self.calls:
            check_arguments(self.tools, call.name, json.loads(call.arguments))
        return self.calls


def _longest_start(text: str, patterns: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins one of `patterns` (not all of it)."""
    best = 0
    for pattern in patterns:
        for n in range(min(len(text), len(pattern) - 1), best, -1):
            if pattern.startswith(text[len(text) - n:]):
                best = n
                break
    return best
