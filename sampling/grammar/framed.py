"""Tool calls in a model's own syntax: fixed text around JSON arguments, one grammar.

`opening call (separator call)* closing`, where each call is `head ARGUMENTS tail` for one of the
callable functions (`head` holds its name), ARGUMENTS is valid against `arguments["anyOf"][i]`
(compiled by the schema compiler with every rule it has: $refs, budgets, formats), and `tail` may
hold an id of `id_length` letters and digits at `id_at` (Mistral writes one per call). Everything
else the grammar does is unchanged: token masks, the budget that always finishes a call, the
`auto` trigger (trigger.py), whose opening may also be one special token (`opening_token`), which
has no text and so is no part of the bytes here.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from . import ir
from .schema import SchemaCompiler

_ID_CHARS = ir.Bytes(ir.byte_mask(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))


@dataclass(frozen=True)
class CallFrame:
    head: str
    tail: str
    id_length: int = 0
    id_at: int = 0


@dataclass(frozen=True)
class TextFrame:
    opening: str
    calls: tuple[CallFrame, ...]
    arguments: dict[str, Any]  # {"anyOf": [call i's arguments schema, ...]}: $refs point into it
    separator: str = ""
    closing: str = ""
    max_calls: int | None = None
    opening_token: int | None = None
    # Under `auto`: calls may follow text, opened where the text first holds `marker` (a prefix of
    # the calls' text) or the opening token (trigger.py).
    after_text: bool = False
    marker: str = ""

    def key(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


class FramedCompiler(SchemaCompiler):
    def __init__(self, frame: TextFrame, *, count_strings: bool = True) -> None:
        super().__init__(frame.arguments, count_strings=count_strings)
        self.frame = frame

    def compile(self) -> list[object]:
        f = self.frame
        branches = []
        for i, call in enumerate(f.calls):
            tail = ir.lit(call.tail.encode())
            if call.id_length:
                before, after = call.tail[:call.id_at].encode(), call.tail[call.id_at:].encode()
                tail = ir.seq(ir.lit(before), ir.Repeat(_ID_CHARS, call.id_length, call.id_length), ir.lit(after))
                self.literals.update({before, after})
            branches.append(ir.seq(ir.lit(call.head.encode()), self.node(f.arguments["anyOf"][i], f"/anyOf/{i}"), tail))
            self.literals.update({call.head.encode(), call.tail.encode()})
        one: object = ir.alt(*branches)
        more: object = ir.EMPTY
        if f.max_calls != 1:
            self.rules.append(one)  # called twice: one copy of every function's arguments, not two
            one = ir.Call(len(self.rules) - 1)
            hi = None if f.max_calls is None else f.max_calls - 1
            more = ir.Repeat(ir.seq(ir.lit(f.separator.encode()), one), 0, hi)
        self.rules[0] = ir.seq(ir.lit(f.opening.encode()), one, more, ir.lit(f.closing.encode()))
        self.literals.update({s.encode() for s in (f.opening, f.separator, f.closing) if s})
        self.literals.discard(b"")
        return list(self.rules)
