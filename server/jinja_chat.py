"""A GGUF chat template rendered with Jinja, as Hugging Face's `apply_chat_template` does.

Used when the model's template handles tools (llama.cpp's own template function knows only its
built-in templates, and nothing of tools). The template runs in Jinja's immutable sandbox: it
comes from a model file, and must not reach Python objects' internals or change the values it
is given. Variables: `messages` (OpenAI's shapes; a call's `arguments` parsed into an object,
which is what tool-aware templates expect), `tools` (OpenAI's `{"type": "function",
"function": ...}` list, or none), `add_generation_prompt`, `bos_token`, `eos_token`; helpers
`raise_exception(message)`, `strftime_now(format)` and the `tojson` filter.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
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


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def jinja_for(model: Any) -> "JinjaChat | None":
    """The model's template as a JinjaChat when it handles tools, else None."""
    template = getattr(model, "chat_template", None)
    if not template or not handles_tools(template):
        return None
    try:
        return JinjaChat(template, _token_text(model, getattr(model, "bos_token", None)),
                         _token_text(model, getattr(model, "eos_token", None)))
    except TemplateError as exc:  # e.g. a tag only Hugging Face's own environment defines
        _log.warning("the model's chat template does not compile (%s); tools use the generic prompt", exc)
        return None


def _token_text(model: Any, token: int | None) -> str:
    if token is None or token < 0:
        return ""
    return model.token_to_piece(token, special=True).decode("utf-8", errors="replace")


class JinjaChat:
    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(template)
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[ChatMessage], tools: ToolSet | None,
               add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=[_message(m) for m in messages],
                tools=None if tools is None else [
                    {"type": "function", "function": f.declaration()} for f in tools.functions],
                add_generation_prompt=add_generation_prompt, bos_token=self.bos_token, eos_token=self.eos_token,
            )
        # raise_exception(), or template code that cannot take these messages (its own errors too)
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, AttributeError) as exc:
            raise BadRequest(f"the model's chat template refused these messages: {exc}", param="messages") from None


def _message(m: ChatMessage) -> dict[str, Any]:
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
