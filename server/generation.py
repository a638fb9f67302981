"""Submitting a validated request to the engine and following it to the end from asyncio.

Shared by every generation route: admission, the caller's tenant (its tiers and limits, checked
before anything is queued: server/quotas.py), turning the specs into the engine's Requests (chats
rendered) under one id, engine refusals → HTTP errors, accounting of each finished request
(metrics, the request's log line, drain tracking), and waiting for the results while watching
the ASGI receive channel, so a client that hangs up cancels its requests instead of leaving them
running.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import re
import threading
import uuid
from dataclasses import dataclass, field

from engine import (
    EngineClosedError,
    GenerationResult,
    InvalidParameterError,
    PromptTooLongError,
    QueueFullError,
    Request,
    RequestError,
    RequestHandle,
)
from server.errors import APIError, BadRequest, Forbidden, ServiceUnavailable, TooManyRequests, retry_after
from server.auth import Caller
from server.quotas import Admission, Quotas, RateLimited
from server.engine_protocol import ServedEngine
from server.hangup import Receive, wait_for_disconnect
from server.metrics import ServerMetrics
from server.spec import GenerationSpec, engine_requests
from server.state import ServingState

log = logging.getLogger("cobatch.server")

# Seconds a client should wait before retrying a full queue: about one short request's worth.
QUEUE_FULL_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Submitted:
    """One HTTP request's choices, queued: `id` names the whole request (an answer's id); choice
    i's engine request is `id` itself when it is the only one, else `id-i`."""

    id: str
    handles: list[RequestHandle]
    headers: dict[str, str] = field(default_factory=dict)  # the tenant's x-ratelimit-* after this request


class GenerationService:
    def __init__(self, state: ServingState, metrics: ServerMetrics, quotas: Quotas | None = None) -> None:
        self.state = state
        self.metrics = metrics
        self.quotas = quotas or Quotas()
        self._accounting: set[asyncio.Task] = set()

    async def submit(self, specs: list[GenerationSpec], endpoint: str, id_prefix: str, caller: Caller) -> Submitted:
        """Queue the specs (one per choice) as the engine's Requests, all of them, under one id
        `{id_prefix}{random}` (the prefix ends with its API's separator: `chatcmpl-`, `msg_`), or raise the APIError that says why not (nothing is queued then).
        The caller's owner id is the requests' draft scope: only its own outputs propose drafts.
        Its tenant's tiers and limits are checked first: 403 for a tier it may not use, 429 past
        a limit (a request the server sends for a batch job is paced by the job runner instead).
        Runs on a worker thread: rendering a chat and tokenizing a long prompt take milliseconds
        per 10 kB and must not stall the event loop that streams everyone else's tokens."""
        tenant = caller.tenant
        tier = specs[0].priority
        if tier not in tenant.tiers:
            self.metrics.observe_tenant_refusal(tenant.name, "tier_not_allowed")
            raise Forbidden(f"this API key may not use the {tier} tier; it may use "
                            f"{' and '.join(sorted(tenant.tiers))}", param="service_tier", code="tier_not_allowed")
        try:  # a tenant already at a request limit was refused at the door (server/limit_gate.py)
            future = asyncio.get_running_loop().run_in_executor(None, self._submit_blocking, specs, id_prefix, caller)
            submitted, admission = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._abandon)  # cancelled mid-submit: don't leave them running
            raise
        except RateLimited as exc:
            self.metrics.observe_tenant_refusal(tenant.name, exc.reason)
            raise
        tally = _Tally(admission, len(submitted.handles))
        for handle, spec in zip(submitted.handles, specs):
            # Settled as the result is published, before the route can answer: a client that
            # keeps exactly its limit in flight never finds its last request still counted.
            handle.on_result(functools.partial(tally.ended, handle))
            task = asyncio.get_running_loop().create_task(self._account(handle, endpoint, spec.priority, tenant.name,
                                                                        tally))
            self._accounting.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._accounting.discard)
        return submitted

    def _abandon(self, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is None:
            submitted, admission = future.result()
            for handle in submitted.handles:
                handle.cancel()
                self.state.untrack(handle)
            if admission is not None:
                admission.finish()

    def _submit_blocking(self, specs: list[GenerationSpec], id_prefix: str,
                         caller: Caller) -> tuple[Submitted, Admission | None]:
        tenant = caller.tenant
        with self.state.admit() as engine:
            request_id = f"{id_prefix}{uuid.uuid4().hex[:24]}"
            ids = [request_id] if len(specs) == 1 else [f"{request_id}-{i}" for i in range(len(specs))]
            try:
                requests = engine_requests(specs, ids, self.state.chat, caller.owner, tenant.name, tenant.weight)
            except RequestError as exc:
                raise refusal_error(exc, specs[0]) from None
            admission = None if caller.internal else \
                self.quotas.admit(tenant, lambda: _prompt_tokens(engine, requests), sum(r.max_tokens for r in requests))
            try:
                handles = submit_all(engine, requests, specs)
            except BaseException:
                if admission is not None:
                    admission.refund()  # refused by the engine: the request is charged nothing
                raise
            for handle in handles:
                self.state.track(handle)
            return Submitted(request_id, handles, {} if admission is None else admission.headers), admission

    async def _account(self, handle: RequestHandle, endpoint: str, priority: str, tenant: str,
                       tally: "_Tally") -> None:
        result = None
        try:
            result = await handle
            self.metrics.observe_result(endpoint, priority, result, tenant)
            m = result.metrics
            log.info("%s %s tenant=%s tier=%s finish=%s prompt_tokens=%d generated=%d queue_ms=%.0f ttft_ms=%s "
                     "latency_ms=%.0f", handle.request_id, endpoint, tenant, priority, result.finish_reason.value,
                     m.prompt_tokens, m.tokens_generated, m.queue_time_ms,
                     "-" if m.ttft_ms is None else f"{m.ttft_ms:.0f}", m.latency_ms)
        except asyncio.CancelledError:
            handle.cancel()
            raise
        except Exception:
            log.exception("accounting for %s failed", handle.request_id)
        finally:
            self.state.untrack(handle)
            tally.ended(handle, result)

    async def wait(self, handles: list[RequestHandle], receive: Receive, endpoint: str,
                   priority: str) -> list[GenerationResult] | None:
        """Every result, or None if the client disconnected first (its requests are then cancelled)."""
        results_task = asyncio.ensure_future(asyncio.gather(*(_result_of(h) for h in handles)))
        disconnect_task = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            done, _ = await asyncio.wait({results_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
            if results_task in done:
                return results_task.result()
            for handle in handles:
                handle.cancel()
                self.metrics.observe_disconnect(endpoint, priority)
            return None
        finally:
            disconnect_task.cancel()
            if not results_task.done():
                for handle in handles:
                    handle.cancel()  # client gone, or this task was cancelled (forced shutdown)
                results_task.cancel()
                # A cancelled gather ends holding a CancelledError; read it, or asyncio logs it as an
                # error ("exception was never retrieved") on every disconnect.
                results_task.add_done_callback(_retrieve)

    def client_left(self, handle: RequestHandle, endpoint: str, priority: str) -> None:
        if not handle.done():
            handle.cancel()
            self.metrics.observe_disconnect(endpoint, priority)


class _Tally:
    """One HTTP request's choices as they end: its hold on the tenant's limits ends with the last,
    charged what they computed (its prompts, plus every token generated)."""

    def __init__(self, admission: Admission | None, n: int) -> None:
        self._admission = admission
        self._left = n
        self._generated: int | None = 0
        self._ended: set[str] = set()
        self._lock = threading.Lock()  # the engine's thread and the event loop both end choices

    def ended(self, handle: RequestHandle, result: GenerationResult | None) -> None:
        """One choice ended (result None: not known); a choice ended twice counts once."""
        with self._lock:
            if handle.request_id in self._ended:
                return
            self._ended.add(handle.request_id)
            self._left -= 1
            if self._generated is not None:
                # Without every result the charge stays at the most the request could compute.
                self._generated = None if result is None else self._generated + result.metrics.tokens_generated
            last = self._left == 0
        if last and self._admission is not None:
            self._admission.finish(self._generated)


def _prompt_tokens(engine: ServedEngine, requests: list[Request]) -> int:
    """Prompt tokens of the requests' distinct prompts (a chat's choices share one)."""
    distinct = {r.prompt if isinstance(r.prompt, str) else tuple(r.prompt): r for r in requests}
    return sum(len(engine.tokenize(p, add_bos=r.add_bos)) if isinstance(p, str) else len(p)
               for p, r in distinct.items())


def submit_all(engine: ServedEngine, requests: list[Request], specs: list[GenerationSpec]) -> list[RequestHandle]:
    """All queued, or none (the first refusal is raised as its HTTP error)."""
    try:
        if len(requests) == 1:
            return [engine.submit(requests[0])]
        return engine.submit_many(requests)
    except RequestError as exc:
        raise refusal_error(exc, specs[0]) from None


def refusal_error(exc: RequestError, spec: GenerationSpec) -> APIError:
    """The HTTP error for each of the engine's refusals (engine.REFUSALS)."""
    if isinstance(exc, PromptTooLongError):
        return BadRequest(str(exc), param="prompt", code="context_length_exceeded")
    if isinstance(exc, InvalidParameterError):
        if spec.calls_tools:
            return tools_refusal(exc, spec)
        return BadRequest(str(exc), param=_param_of(exc, spec))
    if isinstance(exc, QueueFullError):
        return TooManyRequests(f"the request queue is full ({exc}); retry later", code="queue_full",
                               headers=retry_after(QUEUE_FULL_RETRY_AFTER_S))
    if isinstance(exc, EngineClosedError):
        return ServiceUnavailable(str(exc), code="engine_closed")
    raise TypeError(f"no HTTP status for the refusal {type(exc).__name__}: add it here") from exc


def _param_of(exc: InvalidParameterError, spec: GenerationSpec) -> str | None:
    """The request field an engine InvalidParameterError is about, as the client named it."""
    if exc.field == "json_schema" and spec.structured is not None and spec.structured.source == "response_format":
        return "response_format"  # the OpenAI routes' name for the schema
    return exc.field


def tools_refusal(exc: InvalidParameterError, spec: GenerationSpec) -> APIError:
    """The engine's refusal of a calls grammar, in the request's own terms."""
    assert spec.tools is not None
    if exc.field == "max_tokens":
        needed = "more" if exc.needed_tokens is None else exc.needed_tokens
        shortest = "tool call" if spec.answer_format is None else "answer (a tool call or a document of the format)"
        return BadRequest(f"max_tokens={spec.max_tokens} is below the shortest possible {shortest} here, which "
                          f"needs {needed} tokens", param="max_tokens")
    if exc.field == "json_alternative" and spec.answer_format is not None:  # the output format's schema
        message = str(exc).removeprefix("json_alternative: ")
        return BadRequest(f"'{spec.answer_format.source}' cannot be compiled into a grammar: {message}",
                          param=spec.answer_format.source)
    if exc.field == "json_schema":
        message = str(exc).removeprefix("json_schema: ")
        for pointer in re.findall(r"/[^\s:,]*", message):
            found = spec.tools.parameters_param(pointer)
            if found is not None:  # a keyword inside one function's parameters
                param, rest = found
                message = message.replace(pointer, rest)
                return BadRequest(f"'{param}' cannot be compiled into a grammar: {message} (a JSON pointer "
                                  "within the parameters)", param=param)
        return BadRequest(f"'tools' cannot be compiled into a grammar: {message}", param="tools")
    return BadRequest(str(exc), param=exc.field)


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def _result_of(handle: RequestHandle) -> GenerationResult:
    return await handle
