"""How a model writes tool calls: the text around each call, read off its chat template at load.

A template that handles tools teaches the model one syntax: Qwen 2.5 and Hermes wrap each call in
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, Llama 3.x writes a bare
`{"name": ..., "parameters": ...}`, Mistral `[TOOL_CALLS][{"name": ..., "arguments": ...,
"id": ...}]`. `derive` renders probe conversations (one call, two calls, text, text then a call)
and diffs them, as llama.cpp's chat auto-parser does: what comes before the first call, between
calls and after the last, and around a call's name and arguments. The grammar then writes exactly
that text around arguments it keeps valid (server/tool_grammar.py), and the reader parses it back
(server/tool_reader.py). A call is modelled as

    opening (call_head NAME name_to_args ARGUMENTS call_tail) (separator call)* closing

where ARGUMENTS is the JSON object; a call id the template writes inside call_tail (Mistral's nine
letters and digits) is generated too, and becomes the call's id.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Any

from server.errors import BadRequest

_log = logging.getLogger(__name__)

_NAMES = ("probe_fn_one", "probe_fn_two")
_IDS = ("a1b2c3d4e", "f5g6h7i8j")  # 9 letters and digits: Mistral's templates insist
_TEXT = "Probe text."
_ARGS = ({"probe_key": "probe_value"}, {"probe_key": "probe_other"})


@dataclass(frozen=True)
class ToolSyntax:
    """One model's call syntax; `GENERIC` is cobatch's own `{"tool_calls": [...]}` document."""

    family: str  # "generic", a known family (server/tool_families.py), or "derived"
    source: str  # "generic", "derived" (from the template) or "known" (the family table)
    opening: str = ""
    call_head: str = ""
    name_to_args: str = ""
    call_tail: str = ""
    separator: str = ""
    closing: str = ""
    parallel: bool = False  # the template writes several calls in one answer
    text_before: bool = False  # the template writes content before the calls
    text_joint: str = ""  # what it writes between that content and the calls
    id_length: int = 0  # >0: call_tail holds an id of this many letters and digits at id_at
    id_at: int = 0
    opening_token: int | None = None  # a special token (no text) that opens the calls

    @property
    def is_generic(self) -> bool:
        return self.family == "generic"

    @property
    def start(self) -> str:
        """The text every answer that calls begins with (after an opening special token)."""
        return self.opening + self.call_head

    @property
    def calls_after_text(self) -> bool:
        """Under `auto`, calls may follow text. Not after an opening special token: the reader of
        the text could not see where it opened."""
        return self.text_before and self.opening_token is None

    @property
    def marker(self) -> str:
        """What opens calls written after text (text_before): the start up to the end of its first
        tag (`<tool_call>`), all of it when it has none (`<function=`)."""
        start = self.start
        end = start.find(">")
        return start[:end + 1] if end >= 0 else start

    def call_text(self, name: str, arguments: str, call_id: str = "") -> str:
        """One call as the grammar writes it (arguments: JSON text, verbatim)."""
        tail = self.call_tail
        if self.id_length:
            tail = tail[:self.id_at] + call_id + tail[self.id_at:]
        return self.call_head + name + self.name_to_args + arguments + tail

    def calls_text(self, calls: list[tuple[str, str, str]]) -> str:
        """A whole answer of (name, arguments, id) calls, as the grammar writes it."""
        return self.opening + self.separator.join(self.call_text(*c) for c in calls) + self.closing

    def describe(self) -> str:
        opener = "a special token, then " if self.opening_token is not None else ""
        return (f"{self.family} ({self.source}): calls open with {opener}{self.start!r}, "
                f"{'several' if self.parallel else 'one'} per answer")


GENERIC = ToolSyntax("generic", "generic")


class Renderer:
    """What derive() needs of a template: render message dicts (server/jinja_chat.JinjaChat)."""

    def render_dicts(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                     add_generation_prompt: bool = True) -> str: ...


def derive(template: Renderer) -> ToolSyntax | None:
    """The template's call syntax, or None when its renderings do not show one."""
    tools = [{"type": "function", "function": {"name": n, "description": "A probe.", "parameters": {
        "type": "object", "properties": {"probe_key": {"type": "string"}}, "required": ["probe_key"]}}}
        for n in _NAMES]
    user = {"role": "user", "content": "Probe question?"}

    def calls(k: int) -> list[dict[str, Any]]:
        return [{"id": _IDS[i], "type": "function", "function": {"name": _NAMES[i], "arguments": _ARGS[i]}}
                for i in range(k)]

    def answer(assistant: dict[str, Any]) -> str | None:
        try:
            base = template.render_dicts([user], tools, True)
            full = template.render_dicts([user, assistant], tools, False)
        except BadRequest:
            return None
        return full[len(base):] if full.startswith(base) else None

    one = answer({"role": "assistant", "content": "", "tool_calls": calls(1)})
    text = answer({"role": "assistant", "content": _TEXT})
    if one is None or text is None or _TEXT not in text:
        return None
    turn_end = text[text.index(_TEXT) + len(_TEXT):]
    found = _locate(one, 0)
    if found is None:
        return None
    name_at, args_from, args_to = found
    head, name_to_args = one[:name_at], one[name_at + len(_NAMES[0]):args_from]
    after = one[args_to:]
    core_after = after[:_boundary_left(after, len(after) - _common_suffix(after, turn_end))]
    ending = after[len(core_after):]  # the end of the turn, after the calls
    opening, call_head, call_tail, closing, separator = "", head, core_after, "", ""
    two = answer({"role": "assistant", "content": "", "tool_calls": calls(2)})
    first, second = (None, None) if two is None else (_locate(two, 0), _locate(two, 1))
    if two is not None and first is not None and second is not None and first[0] < second[0]:
        between = two[first[2]:second[0]]
        call_head = head[_boundary_right(head, len(head) - _common_suffix(head, between)):]
        call_tail = core_after[:_common_prefix(core_after, between[:len(between) - len(call_head)])]
        opening, closing = head[:len(head) - len(call_head)], core_after[len(call_tail):]
        separator = between[len(call_tail):len(between) - len(call_head)]
    id_length, id_at = 0, 0
    if _IDS[0] in call_tail:
        id_length, id_at = len(_IDS[0]), call_tail.index(_IDS[0])
        call_tail = call_tail.replace(_IDS[0], "", 1)
    elif _IDS[0] in opening + call_head + name_to_args:
        return None  # an id before the arguments: not a shape this module knows
    syntax = ToolSyntax("derived", "derived", opening, call_head, name_to_args, call_tail, separator, closing,
                        parallel=True, id_length=id_length, id_at=id_at)
    # The pieces must rebuild the template's own renderings (arguments as it wrote them).
    if one != syntax.calls_text([(_NAMES[0], one[args_from:args_to], _IDS[0])]) + ending:
        return None
    if (two is None or first is None or second is None or two != syntax.calls_text(
            [(_NAMES[0], two[first[1]:first[2]], _IDS[0]), (_NAMES[1], two[second[1]:second[2]], _IDS[1])]) + ending):
        syntax = replace(syntax, parallel=False)
    mixed = answer({"role": "assistant", "content": _TEXT, "tool_calls": calls(1)})
    start = opening + call_head
    text_before = (mixed is not None and _TEXT in mixed and start in mixed
                   and mixed.index(_TEXT) < mixed.index(start))
    if not syntax.start.strip():
        return None  # nothing would tell a call from text
    joint = mixed[mixed.index(_TEXT) + len(_TEXT):mixed.index(start)] if text_before and mixed else ""
    return replace(syntax, text_before=text_before, text_joint=joint)


def _locate(rendered: str, i: int) -> tuple[int, int, int] | None:
    """(where call i's name starts, where its arguments object starts, where it ends), None if
    the rendering holds no such call with its arguments as a JSON object."""
    name_at = rendered.find(_NAMES[i])
    if name_at < 0:
        return None
    key_at = rendered.find('"probe_key"', name_at)
    if key_at < 0:
        return None
    start = rendered.rfind("{", name_at, key_at)
    if start < 0 or rendered[start:key_at].strip() != "{":
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(rendered, start)
    except json.JSONDecodeError:
        return None
    return (name_at, start, end) if value == _ARGS[i] else None


# Cuts between markers, not inside one: `<|eom_id|>` against `<|eot_id|>` share `_id|>`.
def _at_boundary(text: str, cut: int) -> bool:
    return cut <= 0 or cut >= len(text) or text[cut - 1] in ">]}\n " or text[cut] in "<[{\n"


def _boundary_left(text: str, cut: int) -> int:
    while not _at_boundary(text, cut):
        cut -= 1
    return cut


def _boundary_right(text: str, cut: int) -> int:
    while not _at_boundary(text, cut):
        cut += 1
    return cut


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def with_opening_token(syntax: ToolSyntax, tokenize: Any, special_tokens: frozenset[int]) -> ToolSyntax:
    """The syntax with its opening split off when the opening is one special token (Mistral's
    `[TOOL_CALLS]` in its own vocabulary): the grammar reads text, and that token has none."""
    if not syntax.opening:
        return syntax
    for cut in range(len(syntax.opening), 0, -1):
        ids = tokenize(syntax.opening[:cut], add_bos=False, parse_special=True)
        if len(ids) == 1 and ids[0] in special_tokens:
            return replace(syntax, opening=syntax.opening[cut:], opening_token=ids[0])
    return syntax
