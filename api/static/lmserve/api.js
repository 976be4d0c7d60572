// This server's own API as the page uses it: /health, /v1/models and a streamed
// /v1/chat/completions (fetch + a ReadableStream read as server-sent events).

/** Thrown for a refused request; `status` is the HTTP status (0 for an error inside the stream). */
export class ApiFailure extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

function headers(apiKey) {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h.Authorization = "Bearer " + apiKey;
  return h;
}

async function failure(response) {
  try {
    const body = await response.json();
    return new ApiFailure((body.error && body.error.message) || response.statusText, response.status);
  } catch (_) {
    return new ApiFailure(response.status + " " + response.statusText, response.status);
  }
}

// Server-sent events: frames end with a blank line; each "data:" line is one payload.
async function* sseData(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = frame
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) yield data; // comments (": keep-alive") carry no data
    }
  }
}

/** GET /health (it needs no key); its JSON whatever the status (503 while loading). */
export async function fetchHealth() {
  return (await fetch("/health")).json();
}

/** The loaded model's OpenAI model object from GET /v1/models. */
export async function fetchModel(apiKey) {
  const response = await fetch("/v1/models", { headers: headers(apiKey) });
  if (!response.ok) throw await failure(response);
  return (await response.json()).data[0];
}

/**
 * Streams one chat completion: `onDelta(content, reasoning)` for every piece of text; returns
 * the reply's statistics (completion tokens, decode rate, time to first token, cached prompt
 * tokens). An abort through `signal` rejects with an AbortError.
 */
export async function streamChat(body, apiKey, signal, onDelta) {
  const started = performance.now();
  let firstAt = null;
  let usage = null;
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(apiKey),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await failure(response);
  for await (const data of sseData(response.body)) {
    if (data === "[DONE]") break;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new ApiFailure(chunk.error.message, 0);
    if (chunk.usage) usage = chunk.usage;
    const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
    if (!delta.content && !delta.reasoning_content) continue;
    if (firstAt === null) firstAt = performance.now();
    onDelta(delta.content || "", delta.reasoning_content || "");
  }
  const ended = performance.now();
  const stats = {};
  if (firstAt !== null) stats.ttft = ((firstAt - started) / 1000).toFixed(2);
  if (usage) {
    stats.tokens = usage.completion_tokens;
    stats.cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    // The decode rate: the tokens after the first over the time after the first.
    if (firstAt !== null && usage.completion_tokens > 1 && ended > firstAt)
      stats.tps = ((usage.completion_tokens - 1) / ((ended - firstAt) / 1000)).toFixed(1);
  }
  return stats;
}
