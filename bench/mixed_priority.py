"""Mixed priorities: interactive requests arriving steadily during a batch flood, priority on vs FIFO.

The workload of the product's original spec, scaled to this machine: a flood of long batch
generations (default 24 x 256 tokens) submitted at once, and short interactive requests
(32 tokens) arriving every --every seconds until the flood has finished. The same workload runs
on an engine with two-tier priority and on one with a single FIFO queue, in the same process,
one after the other (alternating with --trials > 1). Reference: the same interactive requests on
the idle engine, one at a time. Every request generates exactly its max_tokens (ignore_eos), so
both modes do the same work. With --http, the same workload runs through HTTP against
`cobatch serve` processes and llama-server, with and without a busy neighbour (bench/mixed_http.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.abort_floor import TailProbe
from bench.cpu_steal import cpu_ticks, steal_share
from bench.prompts import QUESTIONS
from bench.stats import percentile
from bench.record import RunRecord, add_common_arguments, publish
from bench.table import markdown_table
from engine import Engine, EngineConfig

def interactive_figures(results: list) -> dict:
    ttft = [r.metrics.ttft_ms for r in results]
    e2e = [r.metrics.latency_ms for r in results]
    per_token = [(r.metrics.latency_ms - r.metrics.ttft_ms) / max(1, len(r.token_ids) - 1) for r in results]
    intervals = [ms for r in results for ms in r.metrics.inter_token_ms]
    return {
        "n": len(results),
        **{f"ttft_p{q}": percentile(ttft, q) for q in (50, 95, 99)},
        **{f"e2e_p{q}": percentile(e2e, q) for q in (50, 95, 99)},
        "ms_per_token_p50": statistics.median(per_token),
        # Every interval between an interactive request's tokens, not a per-request mean.
        **{f"itl_p{q}": percentile(intervals, q) if intervals else 0.0 for q in (50, 95)},
        "ttft_steps_max": max(r.metrics.ttft_steps or 0 for r in results),
        "first_token_lane_share": sum(r.metrics.first_token_from_lane for r in results) / len(results),
    }


def idle_reference(engine: Engine, n: int, tokens: int) -> dict:
    results = []
    for i in range(n):
        handle = engine.submit(QUESTIONS[i % len(QUESTIONS)], max_tokens=tokens, ignore_eos=True,
                               priority="interactive", temperature=0.7, seed=i)
        results.append(handle.result())
    return interactive_figures(results)


def flood(engine: Engine, n_batch: int, batch_tokens: int, every_s: float, tokens: int) -> dict:
    prompts = [f"Write a long, detailed story about lighthouse keeper number {i} and the storm."
               for i in range(n_batch)]
    before = engine.stats()
    engine.profile(reset=True)
    ticks = cpu_ticks()
    start = time.perf_counter()
    batch = engine.submit_many(prompts, max_tokens=batch_tokens, ignore_eos=True, temperature=0.7, seed=7)
    interactive, next_arrival, batch_done_at = [], start + every_s, None
    while batch_done_at is None:
        now = time.perf_counter()
        if now >= next_arrival:
            i = len(interactive)
            interactive.append(engine.submit(QUESTIONS[i % len(QUESTIONS)], max_tokens=tokens, ignore_eos=True,
                                             priority="interactive", temperature=0.7, seed=i))
            next_arrival += every_s
        if all(h.done() for h in batch):
            batch_done_at = now
            during_flood = engine.profile()  # every token produced while the flood ran
            stolen = steal_share(ticks, cpu_ticks())
        time.sleep(0.002)
    results = [h.result() for h in interactive]
    batch_tokens_done = sum(len(h.result().token_ids) for h in batch)
    after = engine.stats()
    makespan = batch_done_at - start
    produced = sum(p.sampled for p in during_flood.values())
    decode_steps = during_flood["decode"]
    return {
        **interactive_figures(results),
        "batch_tok_s": batch_tokens_done / makespan,
        # Work done for interactive requests while the flood ran: FIFO defers much of it past
        # the flood's end, so it is what priority's batch loss buys, not what it wastes.
        "interactive_tok_s": (produced - batch_tokens_done) / makespan,
        "all_tok_s": produced / makespan,
        "batch_makespan_s": makespan,
        "suspensions": after.suspensions - before.suspensions,
        "preemptions": after.preemptions - before.preemptions,
        "steps_interrupted": after.steps_interrupted - before.steps_interrupted,
        "bounded_steps": after.latency_bounded_steps - before.latency_bounded_steps,
        "batch_rows_per_bounded_step": (after.batch_rows_granted - before.batch_rows_granted)
        / max(1, after.latency_bounded_steps - before.latency_bounded_steps),
        "calibration_after": after.latency_calibration or 0.0,
        "decode_rows_mean": decode_steps.tokens / max(1, decode_steps.steps),
        "cpu_steal": -1.0 if stolen is None else stolen,  # -1: not measurable here
    }


def per_trial_lines(pairs: list[tuple[dict, dict, dict]]) -> str:
    lines = []
    for trial, (idle, prio, fifo) in enumerate(pairs):
        lines.append(
            f"- trial {trial}: TTFT p95 {prio['ttft_p95']:.0f} ms = {prio['ttft_p95'] / idle['ttft_p95']:.2f}x "
            f"idle (floor {prio['ttft_p95_floor'] / idle['ttft_p95']:.2f}x); inter-token p95 {prio['itl_p95']:.0f} ms "
            f"(FIFO {fifo['itl_p95']:.0f}); batch {prio['batch_tok_s']:.1f} vs "
            f"FIFO {fifo['batch_tok_s']:.1f} tok/s = {prio['batch_tok_s'] / fifo['batch_tok_s']:.2f} "
            f"({change(prio, fifo, 'batch_tok_s')}); all tokens "
            f"{change(prio, fifo, 'all_tok_s')}; gauge step {prio['gauge_step_ms']:.0f} ms after the "
            f"priority flood, {fifo['gauge_step_ms']:.0f} ms after FIFO's; CPU steal during the "
            f"flood {steal_text(prio)} (priority), {steal_text(fifo)} (FIFO)")
    return "\n".join(lines)


def steal_text(figures: dict) -> str:
    return "n/a" if figures["cpu_steal"] < 0 else f"{figures['cpu_steal'] * 100:.0f}%"


def change(prio: dict, fifo: dict, key: str) -> str:
    return f"{(prio[key] / fifo[key] - 1) * 100:+.1f}%"


def run(args: argparse.Namespace, record: RunRecord) -> tuple[str, dict]:
    flash_attn = args.flash_attn == "on"
    common = dict(n_threads=args.threads, max_running=args.max_running, flash_attn=flash_attn)
    engines = {
        "priority": Engine(args.model, interrupt_window=args.interrupt_window,
                           interactive_token_ms=args.interactive_token_ms or None,
                           first_token_lane_tokens=args.first_token_lane_tokens, **common),
        "fifo": Engine(args.model, priority_scheduling=False, **common),
    }
    probe: TailProbe | None = None
    try:
        warm = engines["priority"]
        warm.generate(["Warm-up."], max_tokens=4)
        engines["fifo"].generate(["Warm-up."], max_tokens=4)
        # One fixed step shape, timed right after every flood: the machine's speed at that
        # moment (its speed drifts), and the uninterruptible tail that bounds TTFT.
        probe = TailProbe(warm.model, min(args.batch, args.max_running), args.batch_tokens // 2, args.threads,
                          flash_attn)
        measured: dict[str, list[dict]] = {"idle": [], "priority": [], "fifo": []}
        for trial in range(args.trials):
            idle = idle_reference(warm, args.idle_requests, args.interactive_tokens)
            record.trial(trial=trial, mode="idle", **idle)
            measured["idle"].append(idle)
            order = ("priority", "fifo") if trial % 2 == 0 else ("fifo", "priority")
            for mode in order:
                figures = flood(engines[mode], args.batch, args.batch_tokens, args.every, args.interactive_tokens)
                tail = probe.measure()
                figures.update(gauge_step_ms=tail.step_ms, tail_ms=tail.tail_ms, tail_share=tail.share,
                               ttft_p95_floor=idle["ttft_p50"] + tail.wait_ms(0.95))
                if tail.split_cost is not None:  # a probe of one row has nothing to split
                    figures["split_cost"] = tail.split_cost
                record.trial(trial=trial, mode=mode, **figures)
                measured[mode].append(figures)
                print(f"trial {trial} {mode}: interactive TTFT p95 {figures['ttft_p95']:.0f} ms, inter-token p95 "
                      f"{figures['itl_p95']:.0f} ms, batch {figures['batch_tok_s']:.1f} tok/s, "
                      f"{figures['bounded_steps']} bounded steps with {figures['batch_rows_per_bounded_step']:.1f} "
                      f"batch rows each, calibration {figures['calibration_after']:.2f}, decode rows "
                      f"{figures['decode_rows_mean']:.1f}", file=sys.stderr)
    finally:
        if probe is not None:
            probe.close()
        for engine in engines.values():
            engine.close()
    med = {mode: {k: statistics.median(t[k] for t in trials) for k in trials[0]} for mode, trials in measured.items()}
    rows = []
    for mode in ("idle", "priority", "fifo"):
        m = med[mode]
        rows.append([mode, int(m["n"]), m["ttft_p50"], m["ttft_p95"], m["ttft_p99"], m["e2e_p50"], m["e2e_p95"],
                     m["e2e_p99"], m["ms_per_token_p50"], m["itl_p95"], m.get("batch_tok_s", "-"),
                     m.get("interactive_tok_s", "-"), m.get("all_tok_s", "-"),
                     m.get("suspensions", "-"), m.get("preemptions", "-"), m.get("steps_interrupted", "-")])
    table = markdown_table(
        ["engine", "interactive n", "TTFT p50 ms", "TTFT p95 ms", "TTFT p99 ms", "e2e p50 ms", "e2e p95 ms",
         "e2e p99 ms", "ms/token p50", "inter-token p95 ms", "batch tok/s", "interactive tok/s in flood", "all tok/s in flood",
         "suspensions", "preemptions", "interrupted steps"], rows)
    # Ratios within each trial, then their median: the machine's speed drifts between trials.
    pairs = list(zip(measured["idle"], measured["priority"], measured["fifo"]))
    ttft_ratio = statistics.median(p["ttft_p95"] / i["ttft_p95"] for i, p, _ in pairs)
    fifo_ratio = statistics.median(f["ttft_p95"] / i["ttft_p95"] for i, _, f in pairs)
    floor_ratio = statistics.median(p["ttft_p95_floor"] / i["ttft_p95"] for i, p, _ in pairs)
    loss = statistics.median(1 - p["batch_tok_s"] / f["batch_tok_s"] for _, p, f in pairs)
    batch_ratios = [p["batch_tok_s"] / f["batch_tok_s"] for _, p, f in pairs]
    itl = [p["itl_p95"] for _, p, _ in pairs]
    all_loss = statistics.median(1 - p["all_tok_s"] / f["all_tok_s"] for _, p, f in pairs)
    headline = {"ttft_p95_vs_idle": round(ttft_ratio, 2), "batch_loss_vs_fifo": round(loss, 3),
                "all_tokens_loss_vs_fifo": round(all_loss, 3),
                "fifo_ttft_p95_vs_idle": round(fifo_ratio, 2), "ttft_p95_floor_vs_idle": round(floor_ratio, 2),
                "batch_vs_fifo_per_trial": [round(r, 2) for r in batch_ratios],
                "ttft_p95_vs_idle_per_trial": [round(p["ttft_p95"] / i["ttft_p95"], 2) for i, p, _ in pairs],
                "inter_token_p95_ms_per_trial": [round(x) for x in itl],
                "interactive_token_ms": args.interactive_token_ms,
                "first_token_lane_share": round(med["priority"]["first_token_lane_share"], 2)}
    tail = med["priority"]
    summary = (
        f"{table}\n\nWorkload: {args.batch} batch x {args.batch_tokens} tokens at once; interactive "
        f"{args.interactive_tokens} tokens every {args.every} s until the batch is done; max_running "
        f"{args.max_running}; interrupt_window {args.interrupt_window}; interactive token target "
        f"{args.interactive_token_ms or 'none'} ms; first-token lane up to "
        f"{args.first_token_lane_tokens or 'off'} prompt tokens; flash attention {args.flash_attn}; "
        f"{args.threads} threads; medians of "
        f"{args.trials} trial(s).\n\n"
        f"Ratios are taken within each trial (the machine's speed drifts between trials), then "
        f"the median over trials. Interactive TTFT p95 under the flood, priority: {ttft_ratio:.2f}x "
        f"idle (target <= 2x); "
        f"FIFO: {headline['fifo_ttft_p95_vs_idle']:.2f}x. Interactive inter-token p95 per trial: "
        f"{', '.join(f'{x:.0f}' for x in itl)} ms (target {args.interactive_token_ms or 'none'}). Batch tok/s "
        f"over FIFO's per trial: {', '.join(f'{r:.2f}' for r in batch_ratios)}. Batch throughput, priority vs FIFO: "
        f"{-loss * 100:+.1f}%. Every token produced during the flood, "
        f"batch and interactive, priority vs FIFO: {-all_loss * 100:+.1f}%. Interactive tokens produced during "
        f"the flood: priority {med['priority']['interactive_tok_s']:.1f} tok/s, FIFO "
        f"{med['fifo']['interactive_tok_s']:.1f} tok/s.\n\n"
        f"Per trial. The gauge is the same fixed step, timed right after each flood; CPU steal "
        f"is the share of CPU time the hypervisor took during the flood (/proc/stat). Both show "
        f"whether the machine ran at another speed for one mode than for the other:\n\n"
        f"{per_trial_lines(pairs)}\n\n"
        f"Uninterruptible tail (bench/abort_floor.py): llama.cpp checks for an abort between graph "
        f"nodes, and the output projection over the whole vocabulary is one node. On a decode step "
        f"of {probe.rows} rows it took {tail['tail_ms']:.0f} of {tail['gauge_step_ms']:.0f} ms "
        f"({tail['tail_share'] * 100:.0f}%), measured after each priority flood. An arrival during it waits "
        f"for its end whatever the scheduler does, so even an instant abort everywhere else "
        f"leaves TTFT p95 at idle TTFT p50 + the tail's p95 wait = {tail['ttft_p95_floor']:.0f} ms, "
        f"{floor_ratio:.2f}x idle p95. The first-token lane does not wait for it: it computes a short "
        f"arrival's prompt on a context of its own beside the step in flight (first_token_lane_tokens "
        f"{args.first_token_lane_tokens}); it gave the first token of "
        f"{med['priority']['first_token_lane_share'] * 100:.0f}% of the priority engine's arrivals (median "
        f"over trials)."
    )
    if "split_cost" in tail:
        summary += (f" Splitting such steps into two decodes of half the rows would halve the tail "
                    f"and cost {tail['split_cost'] * 100:+.1f}% per token (same probe).")
        headline["split_cost"] = round(tail["split_cost"], 3)
    return summary, headline


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cobatch bench mixed-priority", description=__doc__)
    parser.add_argument("--batch", type=int, default=24, help="batch requests in the flood")
    parser.add_argument("--batch-tokens", type=int, default=256)
    parser.add_argument("--interactive-tokens", type=int, default=32)
    # The spec says 0.5 s for a machine about 3x faster than this one (see NOTES vs docs/benchmark-history.md).
    parser.add_argument("--every", type=float, default=1.5, help="seconds between interactive arrivals")
    parser.add_argument("--idle-requests", type=int, default=8)
    parser.add_argument("--interrupt-window", type=float, default=EngineConfig.interrupt_window,
                        help="the priority engine's interrupt_window (0: never interrupt a step)")
    parser.add_argument("--interactive-token-ms", type=float, default=EngineConfig.interactive_token_ms,
                        help="the priority engine's per-token target for interactive requests (0: none)")
    parser.add_argument("--first-token-lane-tokens", type=int, default=EngineConfig.first_token_lane_tokens,
                        help="the priority engine's first-token lane: longest prompt it takes (0: off)")
    parser.add_argument("--max-running", "--max-batch", type=int, default=32)
    # On by default, as `cobatch serve` runs: the server is where the two tiers meet.
    parser.add_argument("--flash-attn", choices=["on", "off"], default="on",
                        help="llama.cpp's flash attention for both engines (default on, as cobatch serve)")
    add_common_arguments(parser, trials=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.batch_tokens, args.interactive_tokens = 3, 12, 4
        args.every, args.idle_requests, args.max_running, args.trials = 0.1, 2, 4, 1
    record = RunRecord("mixed-priority", args, args.model, argv)
    publish(record, *run(args, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
