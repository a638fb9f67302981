"""OpenAI's answers to /v1/completions and /v1/chat/completions: full responses and stream chunks,
one class per route.

Shapes follow OpenAI's API so the official clients work unchanged. One id (`cmpl-…` or
`chatcmpl-…`, the id the request was submitted under) and one `created` time name the response
and every chunk of its stream. Streams end with `data: [DONE]`; with
stream_options.include_usage a last chunk carries usage and no choices. A request that ends in an
error mid-stream gets a `data: {"error": ...}` chunk, which the OpenAI clients raise as an
APIError. Finish reasons: "stop", or "length" for both max_tokens and a full context, or
"tool_calls" when (and only when) the message carries complete calls, each valid against its
function's parameters (server/tool_reader.py reads them, streamed or not, so streamed argument
fragments join into exactly the non-streamed text). Responses also carry a non-standard `metrics`
object. Logprobs (when asked for, never with streaming) follow OpenAI's legacy completions format
and its chat format; see server/logprobs.py.
"""
from __future__ import annotations

import time
from typing import Any, AsyncIterator, Iterator, Sequence

from engine import FinishReason, GenerationResult, RequestHandle
from server import logprobs
from server.errors import APIError
from server.openai_schemas import OpenAIRequest
from server.replies import error_for_result, merged_deltas, metrics_payload
from server.sse import encode_event
from server.tiers import SERVICE_TIER_OF
from server.native_reader import spec_reader
from server.tool_reader import Arguments, CallStart, Text, ToolOutputReader


class _Answer:
    """What a completion and a chat answer share: the envelope, usage and metrics, and the order
    of a stream (opening chunks, each choice's deltas as they come, a closing chunk per choice,
    usage, [DONE]). A subclass says what a choice holds."""

    object = ""  # the full response's "object"
    chunk_object = ""  # each stream chunk's

    def __init__(self, request_id: str, model: str, parsed: OpenAIRequest, token_bytes: Sequence[bytes]) -> None:
        self.id = request_id
        self.model = model
        self.specs = parsed.specs
        self.n = parsed.n  # choices per prompt: usage counts each prompt once
        self.include_usage = parsed.include_usage
        self.token_bytes = token_bytes
        self.created = int(time.time())

    def choice(self, i: int, result: GenerationResult) -> dict[str, Any]:
        """Choice i of the full response, but its index and metrics."""
        raise NotImplementedError

    def opening(self) -> Iterator[dict[str, Any]]:
        """The chunks before any choice's text."""
        return iter(())

    def deltas(self, i: int, text: str) -> Iterator[dict[str, Any]]:
        """The chunks for a text delta of choice i."""
        raise NotImplementedError

    def held(self, i: int) -> Iterator[dict[str, Any]]:
        """The chunks of text choice i held back until it ended (a possible start of calls)."""
        return iter(())

    def closing(self, i: int, result: GenerationResult) -> dict[str, Any]:
        """The chunk that finishes choice i."""
        raise NotImplementedError

    def envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "service_tier": SERVICE_TIER_OF[self.specs[0].priority], "choices": choices}

    def chunk(self, i: int, finish_reason: str | None, **fields: Any) -> dict[str, Any]:
        return self.envelope(self.chunk_object, [{"index": i, "finish_reason": finish_reason, "logprobs": None,
                                                  **fields}])

    def response(self, results: list[GenerationResult]) -> dict[str, Any]:
        choices = []
        for i, result in enumerate(results):
            choice = {"index": i, **self.choice(i, result)}
            if self.specs[i].return_token_ids:
                choice["token_ids"] = list(result.token_ids)
            if len(results) > 1:
                choice["metrics"] = metrics_payload(result)
            choices.append(choice)
        payload = self.envelope(self.object, choices)
        payload["usage"] = usage(results, self.n)
        if len(results) == 1:
            payload["metrics"] = metrics_payload(results[0])
        return payload

    async def stream(self, handles: list[RequestHandle]) -> AsyncIterator[bytes]:
        for chunk in self.opening():
            yield encode_event(chunk)
        results: list[GenerationResult | None] = [None] * len(handles)
        async for i, item in merged_deltas(handles):
            if isinstance(item, str):
                for chunk in self.deltas(i, item):
                    yield encode_event(chunk)
                continue
            results[i] = item
            error = error_for_result(item)
            if error is not None:
                yield self.error_event(error)
                return
            for chunk in self.held(i):
                yield encode_event(chunk)
            yield encode_event(self.closing(i, item))
        if self.include_usage:
            payload = self.envelope(self.chunk_object, [])
            payload["usage"] = usage([r for r in results if r is not None], self.n)
            yield encode_event(payload)
        yield encode_event("[DONE]")

    @staticmethod
    def error_event(error: APIError) -> bytes:
        return encode_event(error.body()) + encode_event("[DONE]")


class CompletionAnswer(_Answer):
    """A /v1/completions answer: each choice's text (after its prompt, with echo)."""

    object = chunk_object = "text_completion"

    def choice(self, i: int, result: GenerationResult) -> dict[str, Any]:
        return {"finish_reason": openai_finish_reason(result), "logprobs": self._logprobs(i, result),
                "text": self.echoed(i) + result.text}

    def opening(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.specs)):  # echo: each choice's prompt comes first
            if self.echoed(i):
                yield self.chunk(i, None, text=self.echoed(i))

    def deltas(self, i: int, text: str) -> Iterator[dict[str, Any]]:
        yield self.chunk(i, None, text=text)

    def closing(self, i: int, result: GenerationResult) -> dict[str, Any]:
        return self.chunk(i, openai_finish_reason(result), text="")

    def echoed(self, i: int) -> str:
        """Choice i's prompt text when it asked for echo, else ""."""
        spec = self.specs[i]
        if not spec.echo:
            return ""
        assert isinstance(spec.prompt, (str, list, tuple))
        return logprobs.echo_text(spec.prompt, self.token_bytes)

    def _logprobs(self, i: int, result: GenerationResult) -> dict[str, Any] | None:
        spec = self.specs[i]
        if not spec.want_logprobs:
            return None
        if spec.echo:
            return logprobs.echoed_completion_logprobs(result, self.token_bytes, spec.logprobs, self.echoed(i))
        return logprobs.completion_logprobs(result, self.token_bytes, spec.logprobs)


class ChatAnswer(_Answer):
    """A /v1/chat/completions answer: each choice's assistant message, or its tool calls."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, request_id: str, model: str, parsed: OpenAIRequest, token_bytes: Sequence[bytes]) -> None:
        super().__init__(request_id, model, parsed, token_bytes)
        # Output that may call functions: one reader per choice.
        self.readers = [spec_reader(spec) for spec in self.specs if spec.calls_tools and spec.tools is not None]

    def choice(self, i: int, result: GenerationResult) -> dict[str, Any]:
        spec = self.specs[i]
        choice: dict[str, Any] = {"finish_reason": openai_finish_reason(result), "logprobs": None}
        if spec.want_logprobs:
            choice["logprobs"] = logprobs.chat_logprobs(result, self.token_bytes, spec.logprobs)
        if self.readers:
            self.readers[i].feed(result.text)
            choice["message"], choice["finish_reason"] = self.tool_message(i, result)
        else:
            choice["message"] = {"role": "assistant", "content": result.text}
        return choice

    def opening(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.specs)):  # OpenAI opens a chat stream with the role and empty content
            yield self.chunk(i, None, delta={"role": "assistant", "content": ""})

    def deltas(self, i: int, text: str) -> Iterator[dict[str, Any]]:
        if not self.readers:
            yield self.chunk(i, None, delta={"content": text})
            return
        for event in self.readers[i].feed(text):
            yield self.tool_chunk(i, event)

    def held(self, i: int) -> Iterator[dict[str, Any]]:
        for event in self.readers[i].flush() if self.readers else ():
            yield self.tool_chunk(i, event)

    def closing(self, i: int, result: GenerationResult) -> dict[str, Any]:
        reason = self.tool_message(i, result)[1] if self.readers else openai_finish_reason(result)
        return self.chunk(i, reason, delta={})

    def tool_message(self, i: int, result: GenerationResult) -> tuple[dict[str, Any], str]:
        """The message and finish reason of a choice read by readers[i] (fed all its text)."""
        reader = self.readers[i]
        calls = reader.finish(stopped=result.finish_reason is FinishReason.STOP)
        # The content: the text, or the text written before calls (none for most answers that call).
        content = (reader.content() or None) if reader.is_calls else reader.content()
        if calls is None:  # text, or (never in practice: the grammar closes in time) a call cut short
            return {"role": "assistant", "content": content}, openai_finish_reason(result)
        tool_calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                      for c in calls]
        return {"role": "assistant", "content": content, "tool_calls": tool_calls}, "tool_calls"

    def tool_chunk(self, i: int, event: Text | CallStart | Arguments) -> dict[str, Any]:
        if isinstance(event, Text):
            return self.chunk(i, None, delta={"content": event.text})
        if isinstance(event, CallStart):
            call = {"index": event.index, "id": event.id, "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
        else:
            call = {"index": event.index, "function": {"arguments": event.fragment}}
        return self.chunk(i, None, delta={"tool_calls": [call]})


def openai_finish_reason(result: GenerationResult) -> str:
    return "length" if result.finish_reason in (FinishReason.LENGTH, FinishReason.CONTEXT_LENGTH) else "stop"


def usage(results: list[GenerationResult], n: int = 1) -> dict[str, Any]:
    """Each prompt counted once, however many choices (n) were drawn from it; cached_tokens: of
    those prompt tokens, the ones the prefix cache served."""
    prompt = sum(r.metrics.prompt_tokens for r in results[::n])
    # Forced tokens a grammar appends before the first step can be served from the cache too;
    # only the prompt's count here.
    cached = sum(min(r.metrics.cached_tokens, r.metrics.prompt_tokens) for r in results[::n])
    completion = sum(r.metrics.tokens_generated for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}
