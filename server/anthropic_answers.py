"""Anthropic's answer to /v1/messages: the message, or its stream of named SSE events.

A message's content is text blocks and tool_use blocks, read from the generated text by the same
ToolOutputReader as the chat route's (server/tool_reader.py), so streamed pieces join into exactly
the non-streamed content: text_delta pieces into a text block's text, input_json_delta pieces
into the JSON text of a tool_use block's input. stop_reason: "tool_use" when (and only when) the
answer holds complete calls, each valid against its tool's input_schema; "stop_sequence" with
the matched string when one of the request's stop_sequences ended it; "max_tokens";
"model_context_window_exceeded"; else "end_turn". Calls cut short by max_tokens are not returned
(a stream has sent their pieces by then).

usage follows Anthropic's split: input_tokens are the prompt tokens the prefix cache did not
serve, cache_read_input_tokens those it did (their sum is the prompt, what count_tokens says),
cache_creation_input_tokens 0 (caching is automatic and costs nothing extra). A stream's
message_start cannot know the cache's share yet: it counts the whole prompt as input_tokens, and
message_delta carries the final usage, which the anthropic SDK takes over.
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from engine import FinishReason, GenerationResult, RequestHandle
from server.error_shapes import anthropic_error_event
from server.errors import APIError
from server.replies import error_for_result, read_pieces
from server.spec import GenerationSpec
from server.sse import encode_event
from server.tiers import BATCH, INTERACTIVE
from server.native_reader import spec_reader
from server.tool_reader import Arguments, CallStart, Text, ToolOutputReader

TOOL_USE_ID_PREFIX = "toolu_"
# Anthropic's usage.service_tier names for our tiers.
SERVICE_TIER_OF = {INTERACTIVE: "priority", BATCH: "batch"}


class MessageAnswer:
    """One /v1/messages answer; `prompt_tokens` is the rendered prompt's length (known at submit)."""

    def __init__(self, message_id: str, model: str, spec: GenerationSpec, prompt_tokens: int) -> None:
        self.id = message_id
        self.model = model
        self.spec = spec
        self.prompt_tokens = prompt_tokens
        self.reader: ToolOutputReader | None = None
        if spec.calls_tools and spec.tools is not None:
            self.reader = spec_reader(spec, TOOL_USE_ID_PREFIX)

    # ---- the whole message
    def response(self, results: list[GenerationResult]) -> dict[str, Any]:
        (result,) = results
        if self.reader is not None:
            self.reader.feed(result.text)
        content, stop_reason, stop_sequence = self._outcome(result)
        return self._message(content, stop_reason, stop_sequence, usage(result, self.spec.priority))

    payload = response  # the JSON answer, as server/replies.py reply_in_dialect asks for it

    def _outcome(self, result: GenerationResult) -> tuple[list[dict[str, Any]], str, str | None]:
        """(content blocks, stop_reason, stop_sequence), once the reader has read all the text."""
        if self.reader is None:
            return _text_content(result.text), *self._stop_reason(result)
        calls = self.reader.finish(stopped=result.finish_reason is FinishReason.STOP)
        if calls is not None:
            before = _text_content(self.reader.content())  # text the model wrote before its calls
            return before + [{"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)}
                             for c in calls], "tool_use", None
        text = self.reader.content()  # calls cut short: none returned, only the text before them
        return _text_content(text), *self._stop_reason(result)

    def _stop_reason(self, result: GenerationResult) -> tuple[str, str | None]:
        if result.finish_reason is FinishReason.LENGTH:
            return "max_tokens", None
        if result.finish_reason is FinishReason.CONTEXT_LENGTH:
            return "model_context_window_exceeded", None
        # Only the request's own: a chat format's extra stop (the transcript's "\nuser:") ends a turn.
        if result.stop_string is not None and result.stop_string in self.spec.stop:
            return "stop_sequence", result.stop_string
        return "end_turn", None

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None, stop_sequence: str | None,
                 usage_: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage_}

    # ---- the stream
    async def stream(self, handles: list[RequestHandle]) -> AsyncIterator[bytes]:
        opening = {"input_tokens": self.prompt_tokens, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 0, "output_tokens": 0,
                   "service_tier": SERVICE_TIER_OF[self.spec.priority]}
        yield _event("message_start", message=self._message([], None, None, opening))
        yield _event("ping")
        blocks = _BlockStream()
        async for item in read_pieces(handles, self.reader):
            if not isinstance(item, GenerationResult):
                for event in blocks.piece(item):
                    yield event
                continue
            error = error_for_result(item)
            if error is not None:
                yield self.error_event(error)
                return
            _, stop_reason, stop_sequence = self._outcome(item)
            for event in blocks.close():
                yield event
            yield _event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                         usage=usage(item, self.spec.priority))
            yield _event("message_stop")

    @staticmethod
    def error_event(error: APIError) -> bytes:
        return anthropic_error_event(error)


class _BlockStream:
    """Turns the reader's pieces into content block events, opening and closing blocks in order."""

    def __init__(self) -> None:
        self.index = -1  # the open block's (or the last one's) index
        self.open: str | None = None  # the open block's type

    def piece(self, piece: Text | CallStart | Arguments) -> list[bytes]:
        events: list[bytes] = []
        if isinstance(piece, CallStart):
            events += self._start({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}})
        elif isinstance(piece, Arguments):
            events.append(self._delta({"type": "input_json_delta", "partial_json": piece.fragment}))
        else:
            if self.open != "text":
                events += self._start({"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": piece.text}))
        return events

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", index=self.index)]

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        events = self.close()
        self.index += 1
        self.open = block["type"]
        return events + [_event("content_block_start", index=self.index, content_block=block)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", index=self.index, delta=delta)


def _event(kind: str, **fields: Any) -> bytes:
    return encode_event({"type": kind, **fields}, event=kind)


def _text_content(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text else []  # a stream opens no block for no text


def usage(result: GenerationResult, priority: str) -> dict[str, Any]:
    m = result.metrics
    # Forced tokens a grammar appends before the first step can be served from the cache too;
    # only the prompt's share counts here.
    cached = min(m.cached_tokens, m.prompt_tokens)
    return {"input_tokens": m.prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": m.tokens_generated,
            "service_tier": SERVICE_TIER_OF[priority]}
