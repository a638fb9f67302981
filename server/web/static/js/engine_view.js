// The live engine view: one server-sent events stream (/v1/engine/events, four snapshots a
// second) drawn as cards, the steps' rows by tier, tokens per second by tier, interactive step
// time against the per-token target, KV blocks and the caller's batch jobs.

import { readEvents, request } from "./api.js";
import { $, duration, el, fmt } from "./dom.js";
import { color, lines, splitBar, stackedBars } from "./charts.js";

const KEPT_STEPS = 120;  // bars in the step chart
const KEPT_POINTS = 120;  // 30 s of rates at four events a second
const RATE_WINDOW_S = 2;

export class EngineView {
  constructor() {
    this.controller = null;
    this.steps = [];
    this.rates = { interactive: [], batch: [], at: [] };
    this.latency = [];
    this.samples = [];  // {now, interactive, batch}: tokens generated so far, over the rate window
    this.progress = new Map();  // batch id -> first {at, done} seen, for its ETA
    this.eventsSeen = 0;
  }

  show() {
    if (this.controller) return;
    this.controller = new AbortController();
    this.follow(this.controller);
  }

  hide() {
    if (this.controller) this.controller.abort();
    this.controller = null;
  }

  async follow(controller) {
    while (!controller.signal.aborted) {
      try {
        const response = await request("/v1/engine/events", { signal: controller.signal });
        $("engine-status").textContent = "live";
        await readEvents(response, (event) => this.update(event));
        $("engine-status").textContent = "the server ended the stream; reconnecting…";
      } catch (err) {
        if (controller.signal.aborted) return;
        $("engine-status").textContent = `stream lost (${err.message}); reconnecting…`;
      }
      this.samples = [];  // a restarted server counts from zero
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  update(event) {
    this.eventsSeen += 1;
    $("engine-status").dataset.events = String(this.eventsSeen);
    if (event.batches) this.drawBatches(event.batches);
    if (event.status !== "ok") {
      $("engine-status").textContent = `server ${event.status}`;
      return;
    }
    $("engine-status").dataset.steps = String(event.steps_total);
    this.steps.push(...event.steps);
    this.steps.splice(0, Math.max(0, this.steps.length - KEPT_STEPS));
    for (const step of event.steps) {
      if (step.interactive_rows > 0 && !step.interrupted) this.latency.push(step.seconds * 1000);
    }
    this.latency.splice(0, Math.max(0, this.latency.length - KEPT_STEPS));
    this.trackRates(event);
    this.drawCards(event);
    this.drawCharts(event);
  }

  // Rates over the last RATE_WINDOW_S: a step can take longer than the gap between two events,
  // so a rate between neighbouring events would swing between zero and twice the truth.
  trackRates(event) {
    this.samples.push({ now: event.now, interactive: event.tiers.interactive.tokens_generated,
                        batch: event.tiers.batch.tokens_generated });
    while (this.samples.length > 2 && event.now - this.samples[1].now >= RATE_WINDOW_S) this.samples.shift();
    const first = this.samples[0];
    const seconds = event.now - first.now;
    if (seconds <= 0) return;
    for (const tier of ["interactive", "batch"]) {
      this.rates[tier].push((this.samples[this.samples.length - 1][tier] - first[tier]) / seconds);
      this.rates[tier].splice(0, Math.max(0, this.rates[tier].length - KEPT_POINTS));
    }
  }

  drawCards(event) {
    const last = (values) => (values.length ? values[values.length - 1] : null);
    const cards = [
      ["running", fmt(event.running)],
      ["queued interactive", fmt(event.tiers.interactive.waiting)],
      ["queued batch", fmt(event.tiers.batch.waiting)],
      ["tok/s interactive", fmt(last(this.rates.interactive), 1)],
      ["tok/s batch", fmt(last(this.rates.batch), 1)],
      ["decode threads", fmt(event.decode_threads)],
      ["steps", fmt(event.steps_total)],
      ["interrupted steps", fmt(event.steps_interrupted)],
      ["first-token lane", fmt(event.lane_first_tokens)],
      ["KV blocks used / total", `${fmt(event.kv.blocks_used)} / ${fmt(event.kv.blocks_total)}`],
    ];
    $("engine-cards").replaceChildren(...cards.map(([label, value]) =>
      el("div", { class: "card", "data-card": label }, el("div", { class: "value" }, value), el("div", { class: "label" }, label))));
  }

  drawCharts(event) {
    const interactive = color("interactive");
    const batch = color("batch");
    stackedBars($("steps-chart"), this.steps, [
      { key: "interactive_rows", colour: interactive },
      { key: "batch_rows", colour: batch },
      { key: "interactive_prompt", colour: interactive, alpha: 0.35 },
      { key: "batch_prompt", colour: batch, alpha: 0.35 },
    ], (step) => step.interrupted);
    const last = (v) => (v.length ? fmt(v[v.length - 1], 1) : "");
    lines($("rate-chart"), [
      { values: this.rates.interactive, colour: interactive, label: "interactive", last: last(this.rates.interactive) },
      { values: this.rates.batch, colour: batch, label: "batch", last: last(this.rates.batch) },
    ], { unit: " tok/s" });
    lines($("latency-chart"), [
      { values: this.latency, colour: interactive, label: "interactive step ms", dots: true, last: last(this.latency) },
    ], { target: event.interactive_token_target_ms, unit: " ms" });
    const kv = event.kv;
    splitBar($("kv-chart"), [
      { value: kv.blocks_used, colour: color("accent"), label: "used" },
      { value: kv.blocks_cached, colour: color("cached"), label: "cached" },
      { value: kv.blocks_free, colour: color("free"), label: "free" },
    ]);
  }

  drawBatches(batches) {
    const now = Date.now() / 1000;
    $("engine-batches").replaceChildren(...batches.map((b) => {
      const counts = b.request_counts || { total: 0, completed: 0, failed: 0 };
      const done = counts.completed + counts.failed;
      const seen = this.progress.get(b.id) || { at: now, done };
      this.progress.set(b.id, seen);
      const rate = (done - seen.done) / (now - seen.at);
      const eta = b.status === "in_progress" && rate > 0 ? ` · ETA ${duration((counts.total - done) / rate)}` : "";
      const active = ["validating", "in_progress"].includes(b.status);
      return el("li", { "data-batch": b.id, "data-status": b.status },
        el("span", {}, `${b.id} · ${b.status} · ${done} / ${counts.total}${eta}`),
        active ? el("button", { class: "quiet", type: "button", onclick: () => cancel(b.id) }, "Cancel") : el("span"),
        el("progress", { max: String(Math.max(counts.total, 1)), value: String(done), "aria-label": `${b.id} progress` }));
    }));
  }
}

async function cancel(batchId) {
  await request(`/v1/batches/${batchId}/cancel`, { method: "POST" });
}
