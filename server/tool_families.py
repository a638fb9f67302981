"""Known tool-call families: names for derived syntaxes, and what rendering cannot show.

A template's renderings show the text of its calls (server/tool_syntax.py) but not which of that
text is one special token, nor what a model does outside the template (Llama 3.1's
`<|python_tag|>` opens calls of its built-in tools only, never of the functions a request
declares). Each family here names the markers that identify it in a derived syntax, the special
token that may open its calls, and a syntax to use when `--tool-format <family>` is asked for and
the template's own renderings show none.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from server.tool_syntax import ToolSyntax


@dataclass(frozen=True)
class Family:
    name: str
    models: str  # who writes it, for the docs
    markers: tuple[str, ...]  # all present in a derived syntax's call text: this family
    special_opening: str | None  # a special token that may open its calls, in its own vocabulary
    syntax: ToolSyntax  # its usual syntax, as its templates render it

    def matches(self, syntax: ToolSyntax) -> bool:
        text = syntax.calls_text([("f", "{}", "")])
        return all(m in text for m in self.markers)


def _known(name: str, **pieces: object) -> ToolSyntax:
    return ToolSyntax(name, "known", **pieces)  # type: ignore[arg-type]


FAMILIES: tuple[Family, ...] = (
    Family("hermes", "Qwen 2.5, Hermes 2 Pro / 3, Granite 4, MiMo, Bielik", ("<tool_call>", '"arguments": '), None,
           _known("hermes", call_head='<tool_call>\n{"name": "', name_to_args='", "arguments": ',
                  call_tail="}\n</tool_call>", separator="\n", parallel=True, text_before=True,
                  text_joint="\n")),
    Family("llama3", "Llama 3.1, 3.2, 3.3 (functions; <|python_tag|> is for built-in tools)",
           ('{"name": "', '"parameters": '), None,
           _known("llama3", call_head='{"name": "', name_to_args='", "parameters": ', call_tail="}")),
    Family("mistral", "Mistral Nemo, Small 3.x, Ministral, Devstral", ("[TOOL_CALLS]",), "[TOOL_CALLS]",
           _known("mistral", opening="[TOOL_CALLS][", call_head='{"name": "', name_to_args='", "arguments": ',
                  call_tail=', "id": ""}', separator=", ", closing="]", parallel=True, id_length=9, id_at=9)),
    Family("deepseek", "DeepSeek V3.1", ("<｜tool▁call▁begin｜>",), None,
           _known("deepseek", opening="<｜tool▁calls▁begin｜>", call_head="<｜tool▁call▁begin｜>",
                  name_to_args="<｜tool▁sep｜>", call_tail="<｜tool▁call▁end｜>", closing="<｜tool▁calls▁end｜>",
                  parallel=True, text_before=True)),
    Family("kimi", "Kimi K2", ("<|tool_call_begin|>",), None,
           _known("kimi", opening="<|tool_calls_section_begin|>", call_head="<|tool_call_begin|>functions.",
                  name_to_args=":0<|tool_call_argument_begin|>", call_tail="<|tool_call_end|>",
                  closing="<|tool_calls_section_end|>", text_before=True)),
    Family("functionary", "Functionary v3.1", ("<function=",), None,
           _known("functionary", call_head="<function=", name_to_args=">", call_tail="</function>",
                  parallel=True, text_before=True)),
    Family("minimax", "MiniMax M1", ("<tool_calls>\n",), None,
           _known("minimax", opening="<tool_calls>", call_head='\n{"name": "', name_to_args='", "arguments": ',
                  call_tail="}", closing="\n</tool_calls>", parallel=True)),
    Family("apriel", "Apriel 1.5", ("<tool_calls>[",), None,
           _known("apriel", opening="\n<tool_calls>[", call_head='{"name": "', name_to_args='", "arguments": ',
                  call_tail="}", separator=", ", closing="]</tool_calls>", parallel=True, text_before=True)),
)

NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)


def family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def name_derived(syntax: ToolSyntax) -> ToolSyntax:
    """The derived syntax under its family's name when a known family's markers are in it."""
    for known in FAMILIES:
        if known.matches(syntax):
            return replace(syntax, family=known.name)
    return syntax
