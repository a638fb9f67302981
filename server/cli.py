"""`cobatch serve` (the HTTP server; with --replicas, a Ray Serve cluster of engines: see
server/cluster/) and `cobatch bench` (delegated to bench.cli)."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

DEFAULT_DRAIN_TIMEOUT_S = 30.0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        # bench owns its own arguments (including --help); import it only when asked for.
        from bench.cli import main as bench_main

        return bench_main(args[1:])
    parser = _parser()
    options = parser.parse_args(args)
    if options.command != "serve":
        parser.print_help()
        return 2
    problem = _model_spec_problem(options.model)
    if problem:
        parser.error(problem)
    if options.interactive_batch_rows < 0:
        parser.error(f"--interactive-batch-rows must be >= 0, got {options.interactive_batch_rows}")
    if not 0.0 <= options.cache_max_fraction <= 1.0:
        parser.error(f"--cache-max-fraction must be between 0 and 1, got {options.cache_max_fraction}")
    if options.replicas is not None or options.ray_address is not None:
        return serve_cluster(parser, options)
    return serve(options)


def _parser() -> argparse.ArgumentParser:
    from engine.config import EngineConfig  # defaults live with the settings they belong to

    defaults = EngineConfig()
    parser = argparse.ArgumentParser(prog="cobatch", description="Continuous-batching LLM inference server.")
    commands = parser.add_subparsers(dest="command")
    serve_cmd = commands.add_parser("serve", help="serve the model over HTTP (native and OpenAI-compatible APIs)")
    serve_cmd.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve_cmd.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve_cmd.add_argument(
        "--model", default=None,
        help="GGUF file path, or owner/repo/file.gguf on Hugging Face (default: the bundled Gemma 3 270M)",
    )
    serve_cmd.add_argument("--n-ctx", type=int, default=defaults.n_ctx, help="KV cache cells shared by all requests")
    serve_cmd.add_argument("--max-batch", type=int, default=defaults.max_batch, help="sequences generating at once")
    serve_cmd.add_argument("--step-token-budget", type=int, default=defaults.step_token_budget,
                           help="tokens per decode step")
    serve_cmd.add_argument("--threads", type=int, default=None,
                           help="CPU threads (default: all cores; with --replicas N, the node's cores / N per replica)")
    serve_cmd.add_argument("--max-waiting", type=int, default=defaults.max_waiting,
                           help="queued batch requests before 429")
    serve_cmd.add_argument("--max-waiting-interactive", type=int, default=defaults.max_waiting_interactive,
                           help="queued interactive requests before 429")
    serve_cmd.add_argument("--batch-min-share", type=float, default=defaults.batch_min_share,
                           help="share of slots, prompt tokens and steps batch work always keeps")
    serve_cmd.add_argument("--no-priority", action="store_true",
                           help="one FIFO queue: ignore request priority")
    serve_cmd.add_argument("--interactive-batch-rows", type=int, default=defaults.interactive_batch_rows or 0,
                           help="while interactive requests decode, batch tokens per step at most, so each "
                                "interactive token waits for a short step (default 3; 0: no bound)")
    serve_cmd.add_argument("--no-adaptive-threads", action="store_true",
                           help="always use --threads; by default each step uses the thread count measured "
                                "fastest, which drops to fewer threads while other processes load the cores")
    serve_cmd.add_argument("--no-jump-forward", action="store_true",
                           help="sample every token of a JSON document, even where the schema allows "
                                "one continuation only")
    serve_cmd.add_argument("--no-prefix-cache", action="store_true",
                           help="do not keep finished requests' prompt blocks for reuse")
    # On by default, as in llama-server: llama.cpp's CPU kernel skips the cells a row's mask hides,
    # so the other requests' cells in the unified cache (and idle cached prefixes) cost a step
    # almost nothing. The Engine's own default stays off, for outputs independent of neighbours.
    serve_cmd.add_argument("--flash-attn", choices=["on", "off"], default="on",
                           help="llama.cpp's flash attention (default on)")
    serve_cmd.add_argument("--cache-max-fraction", type=float, default=defaults.cache_max_fraction,
                           help="share of KV cells idle cached prefixes may hold (default 0.25); with --flash-attn "
                                "off every decode step attends over held cells, so a smaller share trades prefix "
                                "hits for speed")
    serve_cmd.add_argument(
        "--drain-timeout", type=float, default=DEFAULT_DRAIN_TIMEOUT_S,
        help="seconds running requests get to finish at shutdown (default 30)",
    )
    serve_cmd.add_argument("--model-id", default=None, help="name to serve the model as (default: file stem)")
    serve_cmd.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    cluster = serve_cmd.add_argument_group("several engines (Ray Serve; needs the extra: pip install 'cobatch[ray]')")
    cluster.add_argument("--replicas", type=int, default=None,
                         help="run N engine replicas behind one ingress on Ray Serve (default: one engine, no Ray)")
    cluster.add_argument("--ray-address", default=None,
                         help="join this Ray cluster (e.g. 10.0.0.1:6379, after `ray start --head` there); "
                              "default: start a local Ray instance")
    cluster.add_argument("--routing", choices=["prefix", "round-robin", "power-of-two"], default="prefix",
                         help="how a replica is chosen: Ray's prefix-cache affinity router (default), or "
                              "its cache-blind round-robin or power-of-two choices")
    cluster.add_argument("--imbalanced-threshold", type=float, default=4,
                         help="prefix routing yields to load balancing when replicas' requests in flight "
                              "differ by more than this (default 4)")
    cluster.add_argument("--replica-cpus", type=float, default=1.0,
                         help="Ray logical CPUs each engine replica reserves (default 1)")
    return parser


def _model_spec_problem(spec: str | None) -> str | None:
    """Fail at once on a local path that does not exist (a Hugging Face spec is checked when loading)."""
    if spec is None or Path(spec).expanduser().is_file():
        return None
    text = spec[len("hf://"):] if spec.startswith("hf://") else spec
    parts = text.split("/")
    if len(parts) >= 3 and parts[-1].endswith(".gguf") and not Path(spec).is_absolute():
        return None
    return f"--model {spec}: no such file (give a GGUF path, or owner/repo/file.gguf on Hugging Face)"


def engine_options_from(options: argparse.Namespace) -> dict[str, Any]:
    """The Engine keyword arguments that `cobatch serve`'s flags select."""
    from engine.config import EngineConfig

    return dict(
        n_ctx=options.n_ctx,
        max_batch=options.max_batch,
        step_token_budget=options.step_token_budget,
        n_threads=options.threads or EngineConfig().n_threads,
        max_waiting=options.max_waiting,
        max_waiting_interactive=options.max_waiting_interactive,
        batch_min_share=options.batch_min_share,
        priority_scheduling=not options.no_priority,
        interactive_batch_rows=options.interactive_batch_rows or None,
        adaptive_threads=not options.no_adaptive_threads,
        jump_forward=not options.no_jump_forward,
        prefix_cache=not options.no_prefix_cache,
        cache_max_fraction=options.cache_max_fraction,
        flash_attn=options.flash_attn == "on",
    )


def serve_cluster(parser: argparse.ArgumentParser, options: argparse.Namespace) -> int:
    options.replicas = 1 if options.replicas is None else options.replicas
    if options.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {options.replicas}")
    try:
        from server.cluster.deploy import serve_cluster as run
    except ImportError as exc:
        parser.error(f"--replicas needs Ray Serve ({exc}); install it with: pip install 'cobatch[ray]'")
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine_options = {**engine_options_from(options), "n_threads": options.threads}  # None: per replica
    return run(options, engine_options)


def serve(options: argparse.Namespace) -> int:
    import uvicorn  # imported here so `cobatch bench` does not pay for the server stack

    from server.app import create_app
    from server.context import ServerSettings
    from server.draining_server import DrainingServer

    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine_options = engine_options_from(options)

    def load_engine() -> Any:
        from engine import Engine

        return Engine(options.model, **engine_options)

    server_box: list[Any] = []
    failed: list[BaseException] = []

    def on_load_failure(exc: BaseException) -> None:
        failed.append(exc)  # a server with no model is no use: exit (non-zero) instead of idling
        if server_box:
            server_box[0].should_exit = True

    settings = ServerSettings(drain_timeout=options.drain_timeout, model_id=options.model_id)
    app = create_app(load_engine, settings, on_load_failure=on_load_failure)
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        lifespan="on",
        # Backstop only: the app's own drain finishes or cancels requests within drain_timeout.
        timeout_graceful_shutdown=int(options.drain_timeout) + 10,
    )
    server = DrainingServer(config, on_signal=app.state.ctx.state.begin_shutdown)
    server_box.append(server)
    server.run()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
