// The playground: a chat over /v1/chat/completions, streamed, with the request's settings, an
// optional JSON Schema (the answer shown as formatted JSON and checked against the schema by
// the server's /v1/web/validate, with the jsonschema package), and per answer what the page
// measured (time to first token, tokens per second) and what usage reported (prompt and
// cached tokens).

import { ApiError, getJson, readEvents, request } from "./api.js";
import { $, el, fmt } from "./dom.js";
import { Conversations } from "./conversations.js";

const SETTINGS = ["system", "temperature", "max-tokens", "tier", "stop", "schema"];

let model = null;
let conversation = { id: null, title: null, messages: [] };
let conversations = null;
let running = null;  // the AbortController of the answer being streamed

export async function startChat(modelId) {
  model = modelId;
  conversations = new Conversations({ onOpen: openConversation });
  $("chat-form").addEventListener("submit", (event) => {
    event.preventDefault();
    send().catch(showError);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      send().catch(showError);
    }
  });
  $("cancel").addEventListener("click", () => running && running.abort());
  await conversations.refresh();
}

function showError(err) {
  $("chat-error").textContent = err.message || String(err);
}

function readSettings() {
  const settings = {};
  for (const id of SETTINGS) settings[id] = $(id).value;
  return settings;
}

function writeSettings(settings) {
  for (const id of SETTINGS) if (settings && id in settings) $(id).value = settings[id];
}

function openConversation(found) {
  conversation = found || { id: null, title: null, messages: [] };
  if (found) writeSettings(found.settings);
  $("messages").replaceChildren(...conversation.messages.map((m) => messageElement(m)));
  $("chat-error").textContent = "";
}

// The request body the settings make, or an Error naming the setting that is wrong.
function body(settings, history) {
  const messages = [];
  if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
  messages.push(...history.map(({ role, content }) => ({ role, content })));
  const out = {
    model, messages, stream: true, stream_options: { include_usage: true },
    temperature: Number(settings.temperature), max_tokens: Number(settings["max-tokens"]),
    service_tier: settings.tier,
  };
  const stop = settings.stop.split(",").map((s) => s.trim()).filter(Boolean);
  if (stop.length) out.stop = stop;
  if (settings.schema.trim()) {
    let schema;
    try {
      schema = JSON.parse(settings.schema);
    } catch (err) {
      throw new Error(`The JSON Schema is not valid JSON: ${err.message}`);
    }
    out.response_format = { type: "json_schema", json_schema: { name: "answer", schema, strict: true } };
  }
  return out;
}

async function send() {
  const text = $("prompt").value;
  if (!text.trim() || running) return;
  const settings = readSettings();
  const user = { role: "user", content: text };
  let payload;
  try {
    payload = body(settings, [...conversation.messages, user]);
  } catch (err) {
    $("chat-error").textContent = err.message;
    return;
  }
  $("chat-error").textContent = "";
  $("prompt").value = "";
  conversation.messages.push(user);
  $("messages").append(messageElement(user));
  if (!conversation.id && conversations.serverSide) {
    const made = await conversations.create(text.slice(0, 60), [], settings);
    conversation.id = made.id;
  }
  const answer = { role: "assistant", content: "", stats: {} };
  const node = messageElement(answer);
  node.classList.add("streaming");
  $("messages").append(node);
  await stream(payload, answer, node);
  node.classList.remove("streaming");
  if (answer.content || answer.stats.finish_reason) {
    conversation.messages.push(answer);
    if (payload.response_format) await markSchema(payload.response_format.json_schema.schema, answer, node);
  }
  await conversations.save(conversation.id, { messages: conversation.messages, settings });
}

async function stream(payload, answer, node) {
  running = new AbortController();
  $("send").hidden = true;
  $("cancel").hidden = false;
  const textNode = node.querySelector(".text");
  const started = performance.now();
  let first = null;
  try {
    const response = await request("/v1/chat/completions", { method: "POST", json: payload, signal: running.signal });
    await readEvents(response, (chunk) => {
      for (const choice of chunk.choices || []) {
        const delta = choice.delta && choice.delta.content;
        if (delta) {
          if (first === null) first = performance.now();
          answer.content += delta;
          textNode.textContent = answer.content;
        }
        if (choice.finish_reason) answer.stats.finish_reason = choice.finish_reason;
      }
      if (chunk.usage) {
        answer.stats.prompt_tokens = chunk.usage.prompt_tokens;
        answer.stats.completion_tokens = chunk.usage.completion_tokens;
        answer.stats.cached_tokens = (chunk.usage.prompt_tokens_details || {}).cached_tokens || 0;
      }
      if (chunk.service_tier) answer.stats.tier = chunk.service_tier === "flex" ? "batch" : "interactive";
    });
  } catch (err) {
    if (err.name === "AbortError") answer.stats.finish_reason = "stopped";
    else $("chat-error").textContent = err instanceof ApiError ? err.message : String(err);
  } finally {
    running = null;
    $("send").hidden = false;
    $("cancel").hidden = true;
  }
  const end = performance.now();
  if (first !== null) {
    answer.stats.ttft_ms = first - started;
    const tokens = answer.stats.completion_tokens;
    // The first token ends the wait; the rate is over the tokens that followed it.
    if (tokens > 1 && end > first) answer.stats.tokens_per_s = ((tokens - 1) * 1000) / (end - first);
  }
  node.replaceWith(messageElement(answer));
}

// A structured answer: shown as formatted JSON, and marked after the server checks it.
async function markSchema(schema, answer, node) {
  let document;
  try {
    document = JSON.parse(answer.content);
  } catch (_) {
    answer.stats.schema = { valid: false, errors: [{ path: "/", message: "the answer is not JSON" }] };
    refresh(answer);
    return;
  }
  const verdict = await getJson("/v1/web/validate", { method: "POST", json: { schema, instance: document } });
  answer.stats.schema = { valid: verdict.valid, errors: verdict.errors, checked_with: verdict.checked_with };
  refresh(answer);
}

function refresh(answer) {
  const index = conversation.messages.indexOf(answer);
  const nodes = $("messages").querySelectorAll(".message");
  const node = [...nodes].find((n) => Number(n.dataset.index) === index) || nodes[nodes.length - 1];
  node.replaceWith(messageElement(answer));
}

function messageElement(message) {
  const index = conversation.messages.indexOf(message);
  const item = el("li", { class: `message ${message.role}`, "data-index": index });
  const stats = message.stats || {};
  let shown = message.content;
  let json = false;
  if (stats.schema !== undefined) {
    try {
      shown = JSON.stringify(JSON.parse(message.content), null, 2);
      json = true;
    } catch (_) { /* shown as it came */ }
  }
  item.append(el("pre", { class: json ? "text json" : "text" }, shown));
  if (message.role === "assistant") item.append(statsLine(stats));
  return item;
}

function statsLine(stats) {
  const parts = [];
  if (stats.schema) {
    const valid = stats.schema.valid;
    const why = valid ? stats.schema.checked_with : stats.schema.errors.map((e) => `${e.path}: ${e.message}`).join("; ");
    parts.push(el("span", { class: `badge ${valid ? "valid" : "invalid"}`, title: why || "" },
      valid ? "valid against the schema" : "not valid against the schema"));
  }
  const cell = (label, value, cls) => el("span", { class: cls }, `${label} ${value}`);
  if (stats.ttft_ms !== undefined) parts.push(cell("TTFT", `${fmt(stats.ttft_ms)} ms`, "ttft"));
  if (stats.tokens_per_s !== undefined) parts.push(cell("", `${fmt(stats.tokens_per_s, 1)} tok/s`, "rate"));
  if (stats.prompt_tokens !== undefined) parts.push(cell("prompt", fmt(stats.prompt_tokens), "prompt-tokens"));
  if (stats.cached_tokens !== undefined) parts.push(cell("cached", fmt(stats.cached_tokens), "cached-tokens"));
  if (stats.completion_tokens !== undefined) parts.push(cell("output", fmt(stats.completion_tokens), "output-tokens"));
  if (stats.tier) parts.push(cell("tier", stats.tier, "tier"));
  if (stats.finish_reason) parts.push(cell("finish", stats.finish_reason, "finish"));
  return el("div", { class: "stats" }, parts);
}
