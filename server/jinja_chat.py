"""A GGUF chat template rendered with Jinja exactly as Hugging Face's `apply_chat_template` does.

Every template a GGUF carries is rendered here (server/chat_setup.py); llama.cpp's built-in
matcher only approximates templates it recognises (it drops, for one, a ChatML template's default
system prompt). The environment is Hugging Face's (transformers' `_compile_jinja_template`): the
immutable sandbox, since the template comes from a model file and must neither reach Python
internals nor change the values it is given; `trim_blocks` and `lstrip_blocks`; loop controls;
the `{% generation %}` tag (a no-op when rendering); `tojson` as `json.dumps` with its options and
no HTML escaping; `raise_exception`, `strftime_now`, `dict` and an underscore-proof `namespace`.
Variables: `messages` (OpenAI's shapes; a call's `arguments` parsed into an object, which is what
tool-aware templates expect), `tools` (OpenAI's `{"type": "function", "function": ...}` list, or
none), `add_generation_prompt`, `bos_token`, `eos_token`.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.chat_messages import ChatMessage
from server.errors import BadRequest
from server.tools import ToolSet

_log = logging.getLogger(__name__)


def handles_tools(template: str) -> bool:
    """Whether a template reads the tools it is given (most tool-aware templates name them)."""
    return "tools" in template


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Hugging Face's own filter: Jinja's built-in one escapes HTML characters.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}`: HF marks assistant text with it; it renders its body."""
    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without handing them the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore-prefixed names, as Hugging Face's does."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (Jinja's own signature trick)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a template may not store {name!r} on a namespace")


def jinja_for(model: Any) -> "JinjaChat | None":
    """The model's template as a JinjaChat, or None when it has none or it does not compile."""
    template = getattr(model, "chat_template", None)
    if not template:
        return None
    try:
        return JinjaChat(template, _token_text(model, getattr(model, "bos_token", None)),
                         _token_text(model, getattr(model, "eos_token", None)))
    except TemplateError as exc:
        _log.warning("the model's chat template does not compile with Jinja (%s)", exc)
        return None


def _token_text(model: Any, token: int | None) -> str:
    if token is None or token < 0:
        return ""
    return model.token_to_piece(token, special=True).decode("utf-8", errors="replace")


class JinjaChat:
    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_Generation, loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.globals["dict"] = _Dict()
        env.globals["namespace"] = _Namespace
        self.source = template
        self._template = env.from_string(template)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.handles_tools = handles_tools(template)

    def render(self, messages: list[ChatMessage], tools: ToolSet | None,
               add_generation_prompt: bool = True) -> str:
        declared = None if tools is None else [{"type": "function", "function": f.declaration()}
                                               for f in tools.functions]
        return self.render_dicts([message_dict(m) for m in messages], declared, add_generation_prompt)

    def render_dicts(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                     add_generation_prompt: bool = True) -> str:
        """Messages and tools already in the template's shapes (tool-syntax derivation uses it)."""
        try:
            return self._template.render(messages=messages, tools=tools,
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        # raise_exception(), or template code that cannot take these messages (its own errors too)
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as exc:
            raise BadRequest(f"the model's chat template refused these messages: {exc}", param="messages") from None


def message_dict(m: ChatMessage) -> dict[str, Any]:
    """A message as Hugging Face templates read it."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # as the client sent it
