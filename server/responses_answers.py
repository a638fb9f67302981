"""The Responses API's answer to /v1/responses: the response object, or its stream of typed SSE
events.

A response's output is a message item (one output_text part) or function_call items, read from
the generated text by the same ToolOutputReader as the chat route's (server/tool_reader.py), so
streamed deltas join into exactly the non-streamed text and arguments. function_call items are
returned when (and only when) the answer's calls are complete and valid against their
parameters; calls cut short by max_output_tokens are not (a stream has sent their pieces by then,
and closes their items as "incomplete"). status: "incomplete" (reason "max_output_tokens") when
the answer ran out of tokens or context, else "completed".

A stream numbers its events from 0 (sequence_number) and names each (`event:` and `type`):
response.created, response.in_progress, then per output item its added / delta / done events,
and last response.completed or response.incomplete carrying the whole response, or
response.failed when the request ended without an answer.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

from engine import FinishReason, GenerationResult, RequestHandle
from server.errors import APIError
from server.replies import error_for_result, read_pieces
from server.spec import GenerationSpec
from server.sse import encode_event
from server.tiers import SERVICE_TIER_OF
from server.native_reader import spec_reader
from server.tool_reader import Arguments, Call, CallStart, Text, ToolOutputReader

CALL_ID_PREFIX = "call_"
FUNCTION_CALL_ITEM_PREFIX = "fc_"
TRUNCATED = (FinishReason.LENGTH, FinishReason.CONTEXT_LENGTH)
# The echoed settings of a request that set none (the SDK's Response requires tools and tool_choice).
NOTHING_ECHOED = {"instructions": None, "max_output_tokens": None, "metadata": {}, "tools": [], "tool_choice": "auto",
                  "text": {"format": {"type": "text"}}}


# Keeps a finished response (server/responses_routes.py); False if it could not be kept.
Keep = Callable[[dict[str, Any]], Awaitable[bool]]


class ResponseAnswer:
    """One /v1/responses answer; `echo` is the request's settings as the response repeats them
    (server/responses_schemas.py); `keep`, for a response to store, is called with the finished
    response before it is sent (a client that continues from it at once finds it)."""

    def __init__(self, response_id: str, model: str, spec: GenerationSpec, echo: dict[str, Any],
                 keep: Keep | None = None) -> None:
        self.id = response_id
        self.model = model
        self.spec = spec
        self.echo = echo
        self.keep = keep
        self.created_at = int(time.time())
        self.message_id = f"msg_{uuid.uuid4().hex[:24]}"
        self.reader: ToolOutputReader | None = None
        if spec.calls_tools and spec.tools is not None:
            self.reader = spec_reader(spec, CALL_ID_PREFIX)
        self._sequence = 0

    # ---- the whole response
    def response(self, results: list[GenerationResult]) -> dict[str, Any]:
        (result,) = results
        if self.reader is not None:
            self.reader.feed(result.text)
        return self._finished(result)

    async def payload(self, results: list[GenerationResult]) -> dict[str, Any]:
        """The whole response, kept first when it is to be stored."""
        return await self._kept(self.response(results))

    async def _kept(self, response: dict[str, Any]) -> dict[str, Any]:
        if self.keep is not None and not await self.keep(response):
            response["store"] = False  # said plainly: a later request cannot continue from it
        return response

    def _finished(self, result: GenerationResult) -> dict[str, Any]:
        """The response once the reader (if any) has read all the text."""
        status = "incomplete" if result.finish_reason in TRUNCATED else "completed"
        calls = None if self.reader is None else self.reader.finish(stopped=result.finish_reason is FinishReason.STOP)
        if calls is not None:
            before = self.reader.content()  # text the model wrote before its calls
            output = [self.message_item(before, "completed")] if before else []
            output += [function_call_item(call, "completed") for call in calls]
        else:
            text = result.text if self.reader is None else self.reader.content()  # cut short: the text before
            output = [self.message_item(text, status)] if text else []
        payload = self._envelope(status, output, usage(result))
        if status == "incomplete":
            payload["incomplete_details"] = {"reason": "max_output_tokens"}
        return payload

    def message_item(self, text: str, status: str) -> dict[str, Any]:
        content = [output_text_part(text)] if status != "in_progress" else []
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def _envelope(self, status: str, output: list[dict[str, Any]], usage_: dict[str, Any] | None) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": None, "model": self.model, "output": output,
                "usage": usage_, "temperature": self.spec.temperature, "top_p": self.spec.top_p,
                "parallel_tool_calls": self.spec.tools.parallel if self.spec.tools is not None else True,
                "service_tier": SERVICE_TIER_OF[self.spec.priority], "store": self.keep is not None, "background": False,
                "truncation": "disabled", "reasoning": {"effort": None, "summary": None},
                "previous_response_id": None, "user": None, **NOTHING_ECHOED, **self.echo}

    # ---- the stream
    async def stream(self, handles: list[RequestHandle]) -> AsyncIterator[bytes]:
        opening = self._envelope("in_progress", [], None)
        yield self.event("response.created", response=opening)
        yield self.event("response.in_progress", response=opening)
        items = _ItemStream(self)
        async for item in read_pieces(handles, self.reader):
            if not isinstance(item, GenerationResult):
                for event in items.piece(item):
                    yield event
                continue
            error = error_for_result(item)
            if error is not None:
                yield self.error_event(error)
                return
            status = "incomplete" if item.finish_reason in TRUNCATED else "completed"
            response = await self._kept(self._finished(item))
            complete_calls = any(o["type"] == "function_call" for o in response["output"])
            for event in items.close(status if not complete_calls else "completed"):
                yield event
            yield self.event(f"response.{status}", response=response)

    def error_event(self, error: APIError) -> bytes:
        """The request ended without an answer: response.failed, with the error in the response."""
        failed = self._envelope("failed", [], None)
        code = "rate_limit_exceeded" if error.status_code == 429 else "server_error"
        failed["error"] = {"code": code, "message": error.message}
        return self.event("response.failed", response=failed)

    def event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return encode_event(event, event=kind)


class _ItemStream:
    """Turns the reader's pieces into output item events, opening and closing items in order."""

    def __init__(self, answer: ResponseAnswer) -> None:
        self.answer = answer
        self.index = -1  # the open item's (or the last one's) output_index
        self.open: dict[str, Any] | None = None  # the open item, its text or arguments so far
        self.text = ""

    def piece(self, piece: Text | CallStart | Arguments) -> list[bytes]:
        event = self.answer.event
        if isinstance(piece, CallStart):
            events = self.close("completed")
            self._start(function_call_item(Call(piece.index, piece.id, piece.name), "in_progress"))
            return events + [event("response.output_item.added", output_index=self.index, item=self.open)]
        if isinstance(piece, Arguments):
            self.text += piece.fragment
            return [event("response.function_call_arguments.delta", item_id=self.open["id"],
                          output_index=self.index, delta=piece.fragment)]
        events = []
        if self.open is None or self.open["type"] != "message":
            events += self.close("completed")
            self._start(self.answer.message_item("", "in_progress"))
            events += [event("response.output_item.added", output_index=self.index, item=self.open),
                       event("response.content_part.added", item_id=self.open["id"], output_index=self.index,
                             content_index=0, part=output_text_part(""))]
        self.text += piece.text
        return events + [event("response.output_text.delta", item_id=self.open["id"], output_index=self.index,
                               content_index=0, delta=piece.text, logprobs=[])]

    def close(self, status: str) -> list[bytes]:
        """The open item's done events; `status` is the item's (incomplete: cut short)."""
        item, event = self.open, self.answer.event
        if item is None:
            return []
        self.open = None
        where = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "message":
            done = self.answer.message_item(self.text, status)
            return [event("response.output_text.done", **where, content_index=0, text=self.text, logprobs=[]),
                    event("response.content_part.done", **where, content_index=0, part=output_text_part(self.text)),
                    event("response.output_item.done", output_index=self.index, item=done)]
        done = {**item, "arguments": self.text, "status": status}
        return [event("response.function_call_arguments.done", **where, name=item["name"], arguments=self.text),
                event("response.output_item.done", output_index=self.index, item=done)]

    def _start(self, item: dict[str, Any]) -> None:
        self.index += 1
        self.open, self.text = item, ""


def function_call_item(call: Call, status: str) -> dict[str, Any]:
    # The item's id follows from the call's, so the stream's items and the final response agree.
    return {"id": FUNCTION_CALL_ITEM_PREFIX + call.id.removeprefix(CALL_ID_PREFIX), "type": "function_call",
            "call_id": call.id, "name": call.name, "arguments": call.arguments, "status": status}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage(result: GenerationResult) -> dict[str, Any]:
    m = result.metrics
    # Forced tokens a grammar appends before the first step can be served from the cache too;
    # only the prompt's share counts here.
    cached = min(m.cached_tokens, m.prompt_tokens)
    return {"input_tokens": m.prompt_tokens, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": m.tokens_generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": m.prompt_tokens + m.tokens_generated}
