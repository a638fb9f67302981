"""Choosing, once per model, how its chats are rendered and how it calls tools; said at load.

A GGUF template is rendered with Jinja as Hugging Face does (server/jinja_chat.py); llama.cpp's
built-in matcher only for a template Jinja cannot compile; a file without a template gets
cobatch's Gemma or transcript format. The tool syntax follows `--tool-format`: "auto" (default)
derives it from the template (server/tool_syntax.py) and names its family
(server/tool_families.py), "generic" keeps cobatch's `{"tool_calls": [...]}` document, a family
name imposes that family's syntax. Whatever cannot be derived or matched falls back to the
generic format with a warning: never a failed load.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from server.chat_format import ChatFormatter, detect_style
from server.jinja_chat import jinja_for
from server.tool_families import NAMES, family, name_derived
from server.tool_syntax import GENERIC, ToolSyntax, derive, with_opening_token

log = logging.getLogger("cobatch.server")

TOOL_FORMATS: tuple[str, ...] = ("auto", "generic") + NAMES


def chat_formatter_for(model: Any, tool_format: str = "auto") -> ChatFormatter:
    """The model's ChatFormatter (`model`: bindings.model.Model or anything with its attributes)."""
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"unknown tool format {tool_format!r}; one of {', '.join(TOOL_FORMATS)}")
    jinja = jinja_for(model)
    if jinja is None:
        style = detect_style(model.description, model.chat_template, model)
        if model.chat_template:
            log.warning("chat: the file's template does not compile with Jinja; llama.cpp's built-in matcher "
                        "renders it (an approximation); tools use the generic format")
        else:
            log.info("chat: the file has no chat template; the %s format renders chats, tools use the generic "
                     "format", style)
        if tool_format not in ("auto", "generic"):
            log.warning("chat: --tool-format %s needs a chat template; tools use the generic format", tool_format)
        return ChatFormatter(style, model, model.apply_chat_template if style == "template" else None)
    syntax = tool_syntax_for(jinja, model, tool_format)
    log.info("chat: the file's chat template is rendered with Jinja (as Hugging Face's apply_chat_template); "
             "tool calls: %s", syntax.describe())
    return ChatFormatter("jinja", model, jinja=jinja, tool_syntax=syntax)


def tool_syntax_for(jinja: Any, model: Any, tool_format: str) -> ToolSyntax:
    if tool_format == "generic":
        return GENERIC
    derived = derive(jinja) if jinja.handles_tools else None
    if tool_format == "auto":
        if derived is None:
            if jinja.handles_tools:
                log.warning("chat: the template's tool calls could not be derived from its renderings; tools use "
                            "the generic format (--tool-format names a family to impose one)")
            return GENERIC
        syntax = name_derived(derived)
    else:
        known = family(tool_format)
        if derived is not None and not known.matches(derived):
            log.warning("chat: --tool-format %s does not match the template's own call syntax (%s); using %s",
                        tool_format, derived.describe(), tool_format)
        syntax = replace(derived, family=known.name) if derived is not None and known.matches(derived) \
            else known.syntax
    return with_opening_token(syntax, model.tokenize, frozenset(getattr(model, "special_tokens", ())))
