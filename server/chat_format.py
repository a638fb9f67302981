"""Turning chat messages into prompt tokens.

Four styles, chosen once per model (server/chat_setup.py):

* "jinja": the GGUF file carries a chat template; it is rendered with Jinja exactly as Hugging
  Face's `apply_chat_template` does (server/jinja_chat.py) and tokenized with special tokens
  parsed (what llama.cpp's own server does with `--jinja`).
* "template": a template Jinja cannot compile; llama.cpp's built-in matcher renders it.
* "gemma": the file has no template but is Gemma 3 (its description says gemma3, or its vocab
  has `<start_of_turn>`/`<end_of_turn>` as single tokens). Gemma 3's documented turn format:
      <start_of_turn>user\\n{content}<end_of_turn>\\n<start_of_turn>model\\n
  Gemma has no system role: system/developer text goes before the first user turn's content,
  separated by a blank line (as Gemma 3's published template does); "assistant" becomes "model".
  The markers are tokenized as special tokens and message text as plain text, so a user who
  types "<start_of_turn>" gets those characters, not a forged turn.
* "transcript": anything else: "role: content" lines ending with "assistant:", and "\\nuser:"
  added as a stop string so the model does not write the user's next turn.

With tools, or with earlier tool calls and results in the messages, the messages are first
rewritten into plain turns (server/tool_prompt.py: the tools and an instruction in the system
turn, calls echoed as the grammar writes them, results as turns of their own), unless the model
calls tools in its template's own syntax (server/tool_syntax.py): then the template renders the
tools, the calls and the results itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from server.chat_messages import ROLES, ChatMessage, ToolCallRecord, parse_messages  # noqa: F401 (re-exported)
from server.jinja_chat import JinjaChat
from server.tool_prompt import plain_turns
from server.tool_syntax import GENERIC, ToolSyntax
from server.tools import ToolSet


GEMMA_START, GEMMA_END = "<start_of_turn>", "<end_of_turn>"


class Tokenizer(Protocol):
    def tokenize(self, text: str, *, add_bos: bool = True, parse_special: bool = False) -> list[int]: ...


@dataclass(frozen=True)
class RenderedChat:
    token_ids: list[int]
    extra_stops: tuple[str, ...] = ()


class ChatFormatter:
    """Renders messages for one model in the style chosen by `detect_style`."""

    def __init__(
        self,
        style: str,
        tokenizer: Tokenizer,
        apply_template: Callable[[list[dict[str, str]]], str] | None = None,
        jinja: JinjaChat | None = None,
        tool_syntax: ToolSyntax = GENERIC,
    ) -> None:
        """`jinja`: the model's template (style "jinja"); `tool_syntax`: how the model calls
        tools (native syntaxes need the jinja style: the template renders calls and results)."""
        if style not in ("jinja", "template", "gemma", "transcript"):
            raise ValueError(f"unknown chat style {style!r}")
        if style == "template" and apply_template is None:
            raise ValueError("the template style needs apply_template")
        if style == "jinja" and jinja is None:
            raise ValueError("the jinja style needs the template")
        if not tool_syntax.is_generic and style != "jinja":
            raise ValueError("a native tool syntax needs the jinja style")
        self.style = style
        self._tokenizer = tokenizer
        self._apply_template = apply_template
        self.jinja = jinja
        self.tool_syntax = tool_syntax

    def render(self, messages: list[ChatMessage], tools: ToolSet | None = None) -> RenderedChat:
        if self.style == "jinja":
            assert self.jinja is not None
            if self.tool_syntax.is_generic:
                text = self.jinja.render(plain_turns(messages, tools), None)
            else:
                text = self.jinja.render(messages, tools)
            ids = self._tokenizer.tokenize(text, add_bos=False, parse_special=True)
            return RenderedChat(ids + self._forced_opening(tools))
        messages = plain_turns(messages, tools)
        if self.style == "template":
            assert self._apply_template is not None
            text = self._apply_template([{"role": m.role, "content": m.content} for m in messages])
            # The template usually writes BOS itself; llama.cpp's server tokenizes it the same way.
            return RenderedChat(self._tokenizer.tokenize(text, add_bos=False, parse_special=True))
        if self.style == "gemma":
            return RenderedChat(self._tokens(gemma_segments(messages)))
        return RenderedChat(self._tokens([(transcript_text(messages), False)]), extra_stops=("\nuser:",))

    def _forced_opening(self, tools: ToolSet | None) -> list[int]:
        """A special token that opens calls goes at the end of the prompt when the answer must
        call: the grammar reads text, and that token has none (tool_syntax.py)."""
        token = self.tool_syntax.opening_token
        if token is None or tools is None or tools.choice not in ("required", "named"):
            return []
        return [token]

    def _tokens(self, segments: list[tuple[str, bool]]) -> list[int]:
        ids: list[int] = []
        for text, special in segments:
            if text:  # BOS (when the model wants one) goes before the first piece only
                ids += self._tokenizer.tokenize(text, add_bos=not ids, parse_special=special)
        return ids


def gemma_segments(messages: list[ChatMessage]) -> list[tuple[str, bool]]:
    """(text, is_special_markup) pieces of a Gemma 3 prompt ending with an open model turn."""
    system = "\n\n".join(m.content.strip() for m in messages if m.role in ("system", "developer"))
    turns = [m for m in messages if m.role not in ("system", "developer")]
    segments: list[tuple[str, bool]] = []
    pending_system = system
    for message in turns:
        role = "model" if message.role == "assistant" else "user"
        content = message.content.strip()
        if role == "user" and pending_system:
            content = f"{pending_system}\n\n{content}"
            pending_system = ""
        segments += [(f"{GEMMA_START}{role}\n", True), (content, False), (f"{GEMMA_END}\n", True)]
    segments.append((f"{GEMMA_START}model\n", True))
    return segments


def transcript_text(messages: list[ChatMessage]) -> str:
    lines = [f"{'system' if m.role == 'developer' else m.role}: {m.content.strip()}" for m in messages]
    return "\n".join(lines) + "\nassistant:"


def detect_style(description: str, chat_template: str | None, tokenizer: Tokenizer) -> str:
    """The style for a model without a template Jinja can render ("template": llama.cpp's matcher)."""
    if chat_template:
        return "template"
    name = description.lower().replace(" ", "").replace("-", "").replace("_", "")
    if "gemma3" in name or _has_gemma_turn_tokens(tokenizer):
        return "gemma"
    return "transcript"


def _has_gemma_turn_tokens(tokenizer: Tokenizer) -> bool:
    return all(
        len(tokenizer.tokenize(marker, add_bos=False, parse_special=True)) == 1
        for marker in (GEMMA_START, GEMMA_END)
    )
