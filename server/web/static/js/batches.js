// Batch jobs: upload a JSONL (POST /v1/files), start it (POST /v1/batches), watch it, and
// download its output and error files: the OpenAI-compatible routes, nothing of the page's own.

import { getJson, request } from "./api.js";
import { $, el } from "./dom.js";

const POLL_MS = 2000;

export class BatchesView {
  constructor() {
    this.timer = null;
    $("upload-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.upload().catch((err) => { $("batch-error").textContent = err.message; });
    });
  }

  show() {
    if (this.timer) return;
    const tick = async () => {
      try {
        await this.refresh();
      } catch (err) {
        $("batch-error").textContent = err.message;
      }
      if (this.timer) this.timer = setTimeout(tick, POLL_MS);
    };
    this.timer = setTimeout(tick, 0);
  }

  hide() {
    clearTimeout(this.timer);
    this.timer = null;
  }

  async upload() {
    const file = $("batch-file").files[0];
    if (!file) return;
    $("batch-error").textContent = "";
    const form = new FormData();
    form.append("purpose", "batch");
    form.append("file", file, file.name);
    const uploaded = await getJson("/v1/files", { method: "POST", body: form });
    await getJson("/v1/batches", { method: "POST", json: {
      input_file_id: uploaded.id, endpoint: $("batch-endpoint").value, completion_window: "24h",
      metadata: { filename: file.name.slice(0, 500) } } });
    $("upload-form").reset();
    await this.refresh();
  }

  async refresh() {
    const batches = (await getJson("/v1/batches?limit=20")).data;
    $("batch-rows").replaceChildren(...batches.map((b) => row(b)));
  }
}

function row(b) {
  const counts = b.request_counts || { total: 0, completed: 0, failed: 0 };
  const done = counts.completed + counts.failed;
  const name = (b.metadata && b.metadata.filename) || b.input_file_id;
  const links = [["output", b.output_file_id], ["errors", b.error_file_id]]
    .filter(([, id]) => id)
    .map(([label, id]) => el("a", { href: "#", "data-file": id, onclick: (event) => {
      event.preventDefault();
      download(id, `${b.id}-${label}.jsonl`);
    } }, label));
  const active = ["validating", "in_progress"].includes(b.status);
  return el("tr", { "data-batch": b.id, "data-status": b.status },
    el("td", {}, el("div", {}, name), el("div", { class: "muted small" }, b.id)),
    el("td", {}, b.status),
    el("td", {}, el("progress", { max: String(Math.max(counts.total, 1)), value: String(done),
      "aria-label": `${b.id} progress` }), ` ${done} / ${counts.total}${counts.failed ? ` (${counts.failed} failed)` : ""}`),
    el("td", {}, links),
    el("td", {}, active ? el("button", { class: "quiet", type: "button", onclick: async () => {
      await request(`/v1/batches/${b.id}/cancel`, { method: "POST" });
    } }, "Cancel") : ""));
}

// Downloads go through fetch (the key rides in a header, which a plain link cannot send).
async function download(fileId, name) {
  const blob = await (await request(`/v1/files/${fileId}/content`)).blob();
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
