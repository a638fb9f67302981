"""Turning chat messages into prompt tokens.

Three styles, chosen once per model:

* "template": the GGUF file carries a chat template; llama.cpp renders it and the result is
  tokenized with special tokens parsed (what llama.cpp's own server does).
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
turn, calls echoed as the grammar writes them, results as turns of their own), unless the GGUF
template handles tools itself: then it is rendered with Jinja as Hugging Face does
(server/jinja_chat.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from server.chat_messages import ROLES, ChatMessage, ToolCallRecord, parse_messages  # noqa: F401 (re-exported)
from server.jinja_chat import JinjaChat
from server.tool_prompt import plain_turns
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
    ) -> None:
        """`jinja`: the model's template, when it handles tools (server/jinja_chat.py)."""
        if style not in ("template", "gemma", "transcript"):
            raise ValueError(f"unknown chat style {style!r}")
        if style == "template" and apply_template is None:
            raise ValueError("the template style needs apply_template")
        self.style = style
        self._tokenizer = tokenizer
        self._apply_template = apply_template
        self.jinja = jinja

    def render(self, messages: list[ChatMessage], tools: ToolSet | None = None) -> RenderedChat:
        if self.jinja is not None and (tools is not None or any(m.role == "tool" or m.tool_calls for m in messages)):
            text = self.jinja.render(messages, tools)
            return RenderedChat(self._tokenizer.tokenize(text, add_bos=False, parse_special=True))
        messages = plain_turns(messages, tools)
        if self.style == "template":
            assert self._apply_template is not None
            text = self._apply_template([{"role": m.role, "content": m.content} for m in messages])
            # The template usually writes BOS itself; llama.cpp's server tokenizes it the same way.
            return RenderedChat(self._tokenizer.tokenize(text, add_bos=False, parse_special=True))
        if self.style == "gemma":
            return RenderedChat(self._tokens(gemma_segments(messages)))
        return RenderedChat(self._tokens([(transcript_text(messages), False)]), extra_stops=("\nuser:",))

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
