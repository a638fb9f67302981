// Every call the page makes to the server: the API key (this tab's session storage only) as a
// bearer token, errors in OpenAI's shape turned into exceptions, and server-sent events read
// from fetch (EventSource cannot send an Authorization header).

const KEY = "cobatch.apiKey";

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY);
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// A fetch whose non-2xx answer throws ApiError with the server's message.
export async function request(path, { method = "GET", json, body, signal } = {}) {
  const init = { method, signal, headers: headers(json === undefined ? {} : { "Content-Type": "application/json" }) };
  if (json !== undefined) init.body = JSON.stringify(json);
  else if (body !== undefined) init.body = body;
  const response = await fetch(path, init);
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    let param = null;
    try {
      const error = (await response.json()).error;
      message = error.message || message;
      param = error.param;
    } catch (_) { /* not JSON: keep the status line */ }
    throw new ApiError(response.status, message, param);
  }
  return response;
}

export async function getJson(path, options) {
  return (await request(path, options)).json();
}

// Calls onData(parsed JSON) for each `data:` event of a streamed response until it ends or
// "[DONE]"; an `event: error` or an {"error": ...} payload throws ApiError.
export async function readEvents(response, onData) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const payload = JSON.parse(data);
      if (payload && payload.error) throw new ApiError(500, payload.error.message, payload.error.param);
      onData(payload);
    }
  }
}
