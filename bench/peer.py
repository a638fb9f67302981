"""llama.cpp's own tools as same-run baselines: llama-batched-bench (the decode ceiling) and
llama-server (the peer server), found on PATH or given as a path. Neither is built by cobatch:
build llama.cpp yourself (docs/benchmarks.md, "Regenerating") or skip these columns."""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from bindings.library import amx_built


def find_tool(name: str, explicit: str | None = None) -> str | None:
    """The tool's path: `explicit` (a file, or a folder holding it), else PATH, else None."""
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_dir():
            path = path / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"{path} is not an executable {name}")
        return str(path)
    return shutil.which(name)


def add_peer_arguments(parser: argparse.ArgumentParser) -> None:
    """--peer-bin and --no-peer, for benchmarks that start llama-server beside cobatch."""
    parser.add_argument("--peer-bin", default=None, help="llama-server binary or folder (default: PATH)")
    parser.add_argument("--no-peer", action="store_true", help="do not start a llama-server even if on PATH")


def peer_binary(args: argparse.Namespace) -> str | None:
    """The llama-server to start: none with --no-peer, nor in quick mode (tests stay hermetic)."""
    return None if args.no_peer or args.quick else find_tool("llama-server", args.peer_bin)


def batched_bench_tg(binary: str, model: str, batch_sizes: list[int], threads: int,
                     prompt_tokens: int = 12, generate: int = 32) -> dict[int, float]:
    """S_TG (generation tok/s) per batch size, as llama-batched-bench prints it."""
    command = [binary, "-m", model, "-c", str(max(4096, max(batch_sizes) * (prompt_tokens + generate))),
               "-b", "512", "-ub", "512", "-npp", str(prompt_tokens), "-ntg", str(generate),
               "-npl", ",".join(map(str, batch_sizes)), "-t", str(threads), "-kvu", *cpu_safety_args()]
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True).stdout
    figures: dict[int, float] = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():  # PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | T | S
            figures[int(cells[2])] = float(cells[7])
    return figures


def cpu_safety_args() -> list[str]:
    """What our own engine turns off on this CPU (bindings/library.py), turned off in the peer too:
    a native build here has the same AMX kernels, and the comparison stays like for like."""
    return ["--no-repack"] if amx_built() else []


def speculation_args(spec_type: str) -> list[str]:
    """llama-server's flags for one of its speculation types ("none": its default, no flag), with
    its own defaults for the n-gram settings (`--spec-ngram-simple-size-n` 12 and so on)."""
    return [] if spec_type == "none" else ["--spec-type", spec_type]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(binary: str, model: str, threads: int, slots: int, n_ctx: int,
                 startup_timeout: float = 120.0, extra_args: list[str] | None = None) -> Iterator[str]:
    """Start llama-server on loopback with one unified KV cache shared by `slots` slots (as
    cobatch runs), wait until it answers /health, yield its URL, and stop it."""
    port = free_port()
    command = [binary, "-m", model, "-t", str(threads), "-np", str(slots), "-kvu", "-c", str(n_ctx),
               "--host", "127.0.0.1", "--port", str(port), *cpu_safety_args(), *(extra_args or [])]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited with status {process.returncode}: {' '.join(command)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("llama-server did not become healthy")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
