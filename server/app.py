"""The Starlette application: routes, error handling and the engine's lifecycle.

    app = create_app(lambda: Engine(path, n_ctx=4096), ServerSettings(drain_timeout=30))

Startup begins loading the model on a background thread and returns at once; /health says
"loading" (503) until it is ready. Shutdown stops admission, lets running requests finish for
up to drain_timeout seconds, cancels the rest and closes the engine if the app owns it.
"""
from __future__ import annotations

import contextlib
import logging
from typing import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server import anthropic_routes, generate_routes, openai_routes, responses_routes, tokenize_routes
from engine import EngineStats
from server.auth import OPEN_PATHS, KeyCheck, RequireKeys
from server.context import CANCEL_BACKSTOP_S, SHUTDOWN_BACKSTOP_S, ServerContext, ServerSettings
from server.engine_protocol import ServedEngine
from server.error_shapes import error_response
from server.errors import CLIENT_CLOSED_REQUEST, APIError, InternalError, MethodNotAllowed, NotFound
from server.generation import GenerationService
from server.health import health_payload
from server.jobs.routes import Jobs, job_routes
from server.limit_gate import LimitGate
from server.metrics import ServerMetrics
from server.responses_keeper import ResponseKeeper
from server.responses_stored_routes import stored_response_routes
from server.quotas import Quotas
from server.state import DRAINING, OK, ServingState
from server.web.conversation_routes import Conversations, conversation_routes
from server.web.conversations import ConversationStore
from server.web.events import engine_events
from server.web.page import page_routes
from server.web.schema_check import validate

log = logging.getLogger("cobatch.server")

Handler = Callable[[Request, ServerContext], Awaitable[Response]]


def create_app(
    loader: Callable[[], ServedEngine],
    settings: ServerSettings = ServerSettings(),
    *,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> Starlette:
    """`loader` builds (or returns) the Engine; it runs once, on a background thread. With a data
    directory, raises server.jobs.data_dir_lock.DataDirInUse if another process holds it."""
    state = ServingState(
        loader,
        owns_engine=settings.owns_engine,
        drain_timeout=settings.drain_timeout,
        cancel_backstop=CANCEL_BACKSTOP_S,
        model_id=settings.model_id,
        on_load_failure=on_load_failure,
        tool_format=settings.tool_format,
    )

    def engine_stats() -> EngineStats | None:
        # Readable while serving and draining; after close the engine is gone as far as we care.
        return state.engine.stats() if state.engine is not None and state.status in (OK, DRAINING) else None

    quotas = Quotas()
    metrics = ServerMetrics(engine_stats, lambda: state.in_flight, quotas.in_flight)
    ctx = ServerContext(settings, state, metrics, GenerationService(state, metrics, quotas))

    jobs: Jobs | None = None
    conversations: Conversations | None = None

    def begin_drain() -> None:
        """Shutdown's first step (on SIGTERM, or when the lifespan ends): the job runner stops
        sending before admission closes, so its requests are not refused and resent meanwhile."""
        if jobs is not None:
            jobs.runner.begin_stop()
        state.begin_shutdown()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start_loading()
        if jobs is not None:
            jobs.runner.start()
        try:
            yield
        finally:
            # Also when the app's user is cancelled (Ctrl-C in `cobatch batch`): a process that
            # exits with the engine thread inside llama_decode can die of SIGSEGV.
            begin_drain()
            await run_in_threadpool(state.wait_stopped, settings.drain_timeout + SHUTDOWN_BACKSTOP_S)
            if ctx.responses is not None:
                await ctx.responses.close()
            if conversations is not None:
                await conversations.close()
            if jobs is not None:
                await jobs.close()  # last: it holds the data directory's lock

    # The routes that generate, with their metric labels: the limit gate refuses a tenant at its
    # limits on these before their body is read.
    generating = (("/generate", generate_routes.generate, "generate"),
                  ("/v1/completions", openai_routes.completions, "completions"),
                  ("/v1/chat/completions", openai_routes.chat_completions, "chat_completions"),
                  ("/v1/responses", responses_routes.responses, responses_routes.RESPONSES),
                  ("/v1/messages", anthropic_routes.messages, anthropic_routes.MESSAGES))
    routes = [
        Route("/health", _plain(health, ctx), methods=["GET"]),
        Route("/metrics", _plain(prometheus, ctx), methods=["GET"]),
        Route("/tokenize", _api(tokenize_routes.tokenize, ctx, "tokenize"), methods=["POST"]),
        Route("/detokenize", _api(tokenize_routes.detokenize, ctx, "detokenize"), methods=["POST"]),
        Route("/tokenizer_info", _api(tokenize_routes.tokenizer_info, ctx, "tokenize"), methods=["GET"]),
        Route("/v1/models", _api(openai_routes.list_models, ctx, "models"), methods=["GET"]),
        Route("/v1/models/{model:path}", _api(openai_routes.get_model, ctx, "models"), methods=["GET"]),
        *(Route(path, _api(handler, ctx, label), methods=["POST"]) for path, handler, label in generating),
        *(Route(path, _api(handler, ctx, label), methods=[method])
          for path, handler, method, label in stored_response_routes()),
        Route("/v1/messages/count_tokens", _api(anthropic_routes.count_tokens, ctx, anthropic_routes.COUNT_TOKENS),
              methods=["POST"]),
        Route("/v1/engine/events", _api(engine_events, ctx, "engine_events"), methods=["GET"]),
    ]
    page_paths: frozenset[str] = frozenset()
    if settings.web:
        pages, page_paths = page_routes()
        routes += [Route(r.path, _api(lambda request, c, serve=r.endpoint: serve(request), ctx, "web"),
                         methods=["GET"]) for r in pages]
        routes.append(Route("/v1/web/validate", _api(lambda r, c: validate(r, c.settings.max_body_bytes), ctx,
                                                     "web_validate"), methods=["POST"]))
    middleware, own_headers = [], {}
    if settings.api_keys or settings.admin_api_keys or settings.tenant_keys:
        check = KeyCheck(settings.api_keys, settings.admin_api_keys, settings.tenant_keys)
        open_paths = OPEN_PATHS | page_paths if settings.protect_metrics else OPEN_PATHS | page_paths | {"/metrics"}
        middleware.append(Middleware(RequireKeys, check=check, open_paths=open_paths))
        middleware.append(Middleware(LimitGate, quotas=quotas, metrics=metrics,
                                     endpoints={path: label for path, _, label in generating}))
        own_headers = {"Authorization": f"Bearer {check.internal_key}"}
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: _http_exception})
    app.state.ctx = ctx
    if settings.data_dir is not None:
        # Batch jobs run through this app's own routes, so they are answered as HTTP requests are.
        jobs = Jobs.open(settings.data_dir, app, settings.jobs_in_flight, settings.max_upload_bytes, own_headers,
                         can_submit=lambda: state.status == OK)
        app.router.routes.extend(job_routes(jobs, lambda handler, name: _api(lambda r, c: handler(r), ctx, name)))
        try:  # under the lock Jobs.open took
            ctx.responses = ResponseKeeper.open(settings.data_dir)
            if settings.web:
                conversations = Conversations(ConversationStore(settings.data_dir), settings.max_body_bytes)
        except BaseException:
            jobs.data_dir_lock.release()
            raise
        if conversations is not None:
            app.router.routes.extend(conversation_routes(
                conversations, lambda handler, name: _api(lambda r, c: handler(r), ctx, name)))
    app.state.jobs = jobs
    app.state.begin_drain = begin_drain
    return app


def _api(handler: Handler, ctx: ServerContext, endpoint: str) -> Callable[[Request], Awaitable[Response]]:
    """Turns APIErrors into their responses (in the route's API's shape, server/error_shapes.py) and
    any other exception into a 500 for this request only: the server, the engine and other
    requests carry on."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request, ctx)
        except APIError as err:
            ctx.metrics.observe_rejection(endpoint, err.status_code, err.code or err.error_type)
            return error_response(err, request.scope)
        except ClientDisconnect:
            # The client left before its body was read (uvicorn then reports the hang-up rather
            # than the buffered body): nothing was submitted and nobody reads a reply. Neither a
            # rejection nor a server error.
            log.info("client left %s before its request was read", request.url.path)
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as exc:
            log.exception("request to %s failed", request.url.path)
            ctx.metrics.observe_rejection(endpoint, 500, "internal_error")
            error = InternalError(f"internal error while serving this request: {type(exc).__name__}: {exc}")
            return error_response(error, request.scope)

    return run


def _plain(handler: Handler, ctx: ServerContext) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        return await handler(request, ctx)

    return run


async def health(request: Request, ctx: ServerContext) -> Response:
    jobs = request.app.state.jobs
    payload = health_payload(ctx.state, None if jobs is None else jobs.runner.health())
    if ctx.responses is not None:  # responses held in memory while their store cannot write, and why
        payload["stored_responses"] = ctx.responses.health()
    return JSONResponse(payload, status_code=200 if ctx.state.status == OK else 503)


async def prometheus(request: Request, ctx: ServerContext) -> Response:
    body, content_type = ctx.metrics.exposition()
    return Response(body, media_type=content_type)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Routing errors (unknown path, wrong method) in the same JSON shape as every other error."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound(f"no route for {request.url.path}"), request.scope)
    if exc.status_code == 405:
        err = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
        err.headers.update(exc.headers or {})
        return error_response(err, request.scope)
    return JSONResponse({"error": {"message": exc.detail, "type": "http_error", "param": None, "code": None}},
                        status_code=exc.status_code, headers=exc.headers)
