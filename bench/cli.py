"""`cobatch bench NAME [options]`: runs one benchmark of bench/, prints its Markdown table and stores
the run under bench/results (see bench/record.py); `cobatch bench plot RUN` draws a stored run."""
from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "bulk": "bench.bulk",
    "chat": "bench.chat",
    "cluster": "bench.cluster",  # needs the ray extra
    "decode-step": "bench.decode_step",
    "default-tier": "bench.default_tier",
    "draft-price": "bench.draft_price",
    "http-load": "bench.http_load",
    "idle-cells": "bench.idle_cells",
    "invariance": "bench.invariance",
    "job-finalize": "bench.job_finalize",
    "jobs": "bench.jobs",
    "long-prompt": "bench.long_prompt",
    "memory": "bench.memory",
    "mixed-priority": "bench.mixed_priority",  # with --http: bench.mixed_http
    "plot": "bench.plots",
    "prefix-sharing": "bench.prefix_sharing",
    "schemas": "bench.schema_coverage",
    "sequential": "bench.sequential",
    "shared-cpu": "bench.shared_cpu",
    "speculative": "bench.speculative",
    "structured": "bench.structured",
    "tenants": "bench.tenants",
    "tools": "bench.tools",
    "versions": "bench.versions",  # another benchmark, from two checkouts
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        print("usage: cobatch bench NAME [--quick] [options]\n\nbenchmarks:")
        for name, module in BENCHMARKS.items():
            doc = (importlib.import_module(module).__doc__ or "").strip().splitlines()[0]
            print(f"  {name:16} {doc}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module, rest = BENCHMARKS[argv[0]], argv[1:]
    if module == "bench.mixed_priority" and "--http" in rest:  # against `cobatch serve` in its own process
        module, rest = "bench.mixed_http", [a for a in rest if a != "--http"]
    return importlib.import_module(module).main(rest)


if __name__ == "__main__":
    sys.exit(main())
