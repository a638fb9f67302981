"""`cobatch serve` (the HTTP server; with --replicas, a Ray Serve cluster of engines: see
server/cluster/) and `cobatch bench` (delegated to bench.cli)."""
from __future__ import annotations

import argparse
import logging
import re
import sys
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        # bench owns its own arguments (including --help); import it only when asked for.
        from bench.cli import main as bench_main

        return bench_main(args[1:])
    parser = _parser()
    options = parser.parse_args(args)
    if options.command not in ("serve", "batch"):
        parser.print_help()
        return 2
    problem = (_model_spec_problem(options.model) or _model_spec_problem(options.draft_model, "--draft-model")
               or _engine_options_problem(options))
    if problem:
        parser.error(problem)
    if options.command == "serve":
        options.api_keys = _api_keys(parser, options)
        options.admin_api_keys = _admin_keys(parser, options)
        options.tenant_keys = _tenant_keys(parser, options)
    if options.command == "batch":
        return run_batch(parser, options)
    if options.replicas is not None or options.ray_address is not None:
        return serve_cluster(parser, options)
    return serve(options)


def _parser() -> argparse.ArgumentParser:
    from server.context import ServerSettings
    from server.jobs.store import default_data_dir
    from server.chat_setup import TOOL_FORMATS
    from server.tiers import DEFAULT_TIER_CHOICES

    defaults = ServerSettings()
    parser = argparse.ArgumentParser(prog="cobatch", description="Continuous-batching LLM inference server.")
    commands = parser.add_subparsers(dest="command")
    serve_cmd = commands.add_parser("serve", help="serve the model over HTTP (native and OpenAI-compatible APIs)")
    serve_cmd.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve_cmd.add_argument("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    _add_model_flags(serve_cmd)
    serve_cmd.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout,
                           help="seconds running requests get to finish at shutdown (default: %(default)s)")
    serve_cmd.add_argument("--data-dir", type=Path, default=default_data_dir(),
                           help="where batch jobs, their files and results are kept (default: %(default)s)")
    serve_cmd.add_argument("--max-upload-bytes", type=int, default=defaults.max_upload_bytes,
                           help="largest file /v1/files accepts (default: %(default)s)")
    serve_cmd.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve_cmd.add_argument("--default-tier", default=defaults.default_tier, choices=DEFAULT_TIER_CHOICES,
                           help="the tier of a request that names none (no service_tier or priority): auto is "
                                "interactive for chats (chat completions, responses, messages) and batch for "
                                "completions and /generate "
                                "(default: %(default)s; docs/tiers.md)")
    serve_cmd.add_argument("--tool-format", default=defaults.tool_format, choices=TOOL_FORMATS,
                           help="how the model writes tool calls: auto derives its own syntax from its chat "
                                "template (generic when it cannot), generic is cobatch's {\"tool_calls\": [...]} "
                                "document, a family name imposes that family's syntax "
                                "(default: %(default)s; docs/tools.md)")
    serve_cmd.add_argument("--no-web", dest="web", action="store_false",
                           help="no web page at / (nor its conversation routes); the API is unchanged (docs/web.md)")
    keys = serve_cmd.add_argument_group("API keys (any given: every route but /health needs Authorization: Bearer KEY "
                                        "or x-api-key: KEY)")
    keys.add_argument("--api-key", action="append", default=[], metavar="KEY", help="an accepted key (repeatable)")
    keys.add_argument("--api-key-file", type=Path, default=None,
                      help="a file of accepted keys, one per line (# starts a comment)")
    keys.add_argument("--admin-api-key", action="append", default=[], metavar="KEY",
                      help="an accepted key that also sees every key's files and batches (repeatable); "
                           "any other key sees only its own")
    keys.add_argument("--keys-file", type=Path, default=None,
                      help="tenants and their keys (TOML, or JSON if it ends in .json; keys may be sha256:<hex>): "
                           "each tenant's weight in its tier, default tier, allowed tiers and limits "
                           "(docs/tenants.md)")
    keys.add_argument("--protect-metrics", action="store_true", help="/metrics needs a key too")
    add_engine_flags(serve_cmd.add_argument_group("engine (engine/config.py's EngineConfig, one flag per field)"))
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
                              "differ by more than this (default: %(default)s)")
    cluster.add_argument("--replica-cpus", type=float, default=1.0,
                         help="Ray logical CPUs each engine replica reserves (default: %(default)s)")

    batch_cmd = commands.add_parser("batch", help="run a batch file (OpenAI's batch JSONL) in process, no server")
    batch_cmd.add_argument("input", type=Path, help="JSONL: one {custom_id, method, url, body} request per line")
    batch_cmd.add_argument("-o", "--output", type=Path, required=True,
                           help="JSONL answers, one per custom_id; rerun the same command to resume")
    _add_model_flags(batch_cmd)
    batch_cmd.add_argument("--in-flight", type=int, default=None,
                           help="requests in the engine at once (default: --max-running and a few more)")
    batch_cmd.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_flags(batch_cmd.add_argument_group("engine (engine/config.py's EngineConfig, one flag per field)"))
    return parser


def _add_model_flags(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--model", default=None,
        help="GGUF file path, or owner/repo/file.gguf on Hugging Face (default: the bundled Gemma 3 270M)",
    )
    command.add_argument("--model-id", default=None, help="name to serve the model as (default: file stem)")


def engine_flag(f: Field) -> str:
    """The flag of an EngineConfig field: its metadata's, else its name spelt as a flag."""
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def add_engine_flags(group: Any) -> None:
    """One flag per EngineConfig field, with the field's help and default."""
    from engine.config import EngineConfig

    for f in fields(EngineConfig):
        meta = f.metadata
        flag = engine_flag(f)
        default = meta.get("serve_default", f.default)
        if f.type == "bool" and meta.get("on_off"):
            on, off = meta.get("words", ("on", "off"))
            group.add_argument(flag, dest=f.name, choices=[on, off], default=on if default else off,
                               help=f"{meta['help']} (default: %(default)s)")
        elif f.type == "bool":
            group.add_argument(flag, dest=f.name, action="store_true", default=default,
                               help=f"{meta['help']} (default: {'on' if default else 'off'}; "
                                    f"--no-{flag[2:]} turns it off)")
            group.add_argument("--no-" + flag[2:], dest=f.name, action="store_false", help=argparse.SUPPRESS)
        else:
            kind = {"int": int, "float": float, "int | None": int, "float | None": float, "str | None": str}[f.type]
            shown = "" if default is None else f" (default: {default})"
            if meta.get("zero_is_none") and default is None:
                default = 0
            group.add_argument(flag, *meta.get("aliases", ()), dest=f.name, type=kind, default=default,
                               help=meta["help"] + shown)


def _model_spec_problem(spec: str | None, flag: str = "--model") -> str | None:
    """Fail at once on a local path that does not exist (a Hugging Face spec is checked when loading)."""
    if spec is None or Path(spec).expanduser().is_file():
        return None
    text = spec[len("hf://"):] if spec.startswith("hf://") else spec
    parts = text.split("/")
    if len(parts) >= 3 and parts[-1].endswith(".gguf") and not Path(spec).is_absolute():
        return None
    return f"{flag} {spec}: no such file (give a GGUF path, or owner/repo/file.gguf on Hugging Face)"


def _api_keys(parser: argparse.ArgumentParser, options: argparse.Namespace) -> tuple[str, ...]:
    """--api-key, --api-key-file and COBATCH_API_KEY together."""
    from server.auth import read_keys

    try:
        return read_keys(options.api_key, options.api_key_file)
    except (OSError, ValueError) as exc:
        parser.error(f"API keys: {exc}")


def _admin_keys(parser: argparse.ArgumentParser, options: argparse.Namespace) -> tuple[str, ...]:
    from server.auth import read_keys

    try:
        keys = read_keys(options.admin_api_key, None, environ={})
    except ValueError as exc:
        parser.error(f"admin API keys: {exc}")
    return keys


def _tenant_keys(parser: argparse.ArgumentParser, options: argparse.Namespace) -> tuple[Any, ...]:
    from server.tenants import read_keys_file

    if options.keys_file is None:
        return ()
    try:
        return tuple(read_keys_file(options.keys_file))
    except (OSError, ValueError) as exc:
        parser.error(f"--keys-file: {exc}")


def engine_options_from(options: argparse.Namespace) -> dict[str, Any]:
    """The Engine keyword arguments that `cobatch serve`'s flags select (a flag left at None
    leaves the setting to the Engine)."""
    from engine.config import EngineConfig

    chosen: dict[str, Any] = {}
    for f in fields(EngineConfig):
        value = getattr(options, f.name)
        if f.metadata.get("on_off"):
            value = value == f.metadata.get("words", ("on", "off"))[0]
        elif f.metadata.get("zero_is_none") and value == 0:
            value = None
        elif value is None:
            continue
        chosen[f.name] = value
    return chosen


def _engine_options_problem(options: argparse.Namespace) -> str | None:
    """EngineConfig's own check, worded with the flags' names."""
    from engine.config import EngineConfig

    try:
        EngineConfig(**engine_options_from(options))
    except ValueError as exc:
        message = str(exc)
        names = sorted(fields(EngineConfig), key=lambda f: -len(f.name))
        for f in names:
            message = re.sub(rf"(?<![\w-]){f.name}\b", engine_flag(f), message)
        return message
    return None


def serve_cluster(parser: argparse.ArgumentParser, options: argparse.Namespace) -> int:
    options.replicas = 1 if options.replicas is None else options.replicas
    if options.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {options.replicas}")
    try:
        from server.cluster.deploy import serve_cluster as run
    except ImportError as exc:
        parser.error(f"--replicas needs Ray Serve ({exc}); install it with: pip install 'cobatch[ray]'")
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine_options = {**engine_options_from(options), "n_threads": options.n_threads}  # None: per replica
    return run(options, engine_options)


def serve(options: argparse.Namespace) -> int:
    import uvicorn  # imported here so `cobatch bench` does not pay for the server stack

    from engine.config import EngineConfig
    from server.app import create_app
    from server.context import HTTP_SHUTDOWN_BACKSTOP_S, ServerSettings
    from server.draining_server import DrainingServer
    from server.jobs.data_dir_lock import DataDirInUse
    from server.jobs.runner import in_flight_for

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

    settings = ServerSettings(drain_timeout=options.drain_timeout, model_id=options.model_id,
                              data_dir=options.data_dir, max_upload_bytes=options.max_upload_bytes,
                              jobs_in_flight=in_flight_for(EngineConfig(**engine_options).max_running),
                              api_keys=options.api_keys, admin_api_keys=options.admin_api_keys,
                              tenant_keys=options.tenant_keys, protect_metrics=options.protect_metrics,
                              default_tier=options.default_tier, web=options.web,
                              tool_format=options.tool_format)
    try:
        app = create_app(load_engine, settings, on_load_failure=on_load_failure)
    except DataDirInUse as exc:
        print(f"cobatch serve: {exc}", file=sys.stderr)
        return 1
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        lifespan="on",
        # Backstop only: the app's own drain finishes or cancels requests within drain_timeout.
        timeout_graceful_shutdown=int(options.drain_timeout + HTTP_SHUTDOWN_BACKSTOP_S),
    )
    server = DrainingServer(config, on_signal=app.state.begin_drain)
    server_box.append(server)
    server.run()
    return 1 if failed else 0


def run_batch(parser: argparse.ArgumentParser, options: argparse.Namespace) -> int:
    from engine import Engine, EngineConfig
    from server.app import create_app
    from server.context import ServerSettings
    from server.jobs.offline import run_offline
    from server.jobs.runner import in_flight_for

    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not options.input.is_file():
        parser.error(f"{options.input}: no such file")
    engine_options = engine_options_from(options)
    in_flight = options.in_flight or in_flight_for(EngineConfig(**engine_options).max_running)
    app = create_app(lambda: Engine(options.model, **engine_options), ServerSettings(model_id=options.model_id))
    try:
        return run_offline(options.input, options.output, app, in_flight)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {options.output} keeps every answer so far; rerun the same command to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
