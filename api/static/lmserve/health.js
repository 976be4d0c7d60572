// The server's state in the page's header, from GET /health (it needs no key): the model's
// capabilities as badges, the Reasoning switch only where the model has a reasoning channel,
// and the load (generating, queued).

import { fetchHealth } from "./api.js";
import { setReasoningAvailable } from "./settings.js";

const $ = (id) => document.getElementById(id);

// /health's capabilities as badges: the true features, the context and the warm KV slots.
const FEATURE_BADGES = {
  reasoning: ["reasoning", "a reasoning channel: the Reasoning switch asks for it"],
  tools: ["tools", "function calling"],
  grammar: ["grammar", "constrained output: response_format json_schema, regex, lark"],
  kv_reuse: ["KV reuse", "a follow-up starts from the cached rows of the turn before"],
  spec: ["spec", "speculative decoding is possible (--spec)"],
  batch: ["batch", "queued requests decode together, one pass over the weights per step (--batch)"],
};

function badge(text, title) {
  const span = document.createElement("span");
  span.className = "badge";
  span.textContent = text;
  span.title = title;
  return span;
}

function showCapabilities(caps) {
  const badges = [];
  if (caps.ctx) badges.push(badge("ctx " + caps.ctx, "context length in tokens (--ctx)"));
  if (caps.kv_slots) badges.push(badge(caps.kv_slots + " KV slot" + (caps.kv_slots === 1 ? "" : "s"), "warm conversations kept (--kv-slots)"));
  for (const [name, [text, title]] of Object.entries(FEATURE_BADGES)) if (caps[name]) badges.push(badge(text, title));
  $("caps").replaceChildren(...badges);
  $("caps").dataset.reasoning = caps.reasoning;
  $("caps").dataset.tools = caps.tools;
  setReasoningAvailable(Boolean(caps.reasoning));
}

/** Reads GET /health into the header: the model (until /v1/models names it), badges, the load. */
export async function refreshHealth() {
  try {
    const health = await fetchHealth();
    if (!$("model").dataset.id) $("model").textContent = health.model;
    if (health.capabilities) showCapabilities(health.capabilities);
    const status = $("status");
    status.textContent = health.status + " · " + health.in_flight + " generating · " + health.queued + " queued";
    status.dataset.inFlight = health.in_flight;
    status.dataset.queued = health.queued;
    status.dataset.status = health.status;
  } catch (_) {
    $("status").textContent = "unreachable";
  }
}
