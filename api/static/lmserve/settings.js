// The settings panel: the API key, the system prompt and the sampling fields sent with every
// request, and the reasoning switch. Everything is kept in localStorage ("lmserve.apiKey",
// "lmserve.settings") as the user types it. An empty number field is left out of the request,
// so the server's default (the model's recommended sampling) applies; what the user typed is
// sent as typed and the server names a field it refuses.

const KEY_STORAGE = "lmserve.apiKey";
const SETTINGS_KEY = "lmserve.settings";
// Input id -> request field; the values are the inputs' strings as typed.
const NUMBER_FIELDS = { "max-tokens": "max_tokens", temperature: "temperature", "top-p": "top_p", "top-k": "top_k", "min-p": "min_p", seed: "seed" };
export const DEFAULTS = { system: "", "max-tokens": "512", temperature: "0.7", "top-p": "", "top-k": "", "min-p": "", seed: "", think: false };
const REASONING_EFFORT = "medium";

const $ = (id) => document.getElementById(id);

function stored() {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") };
  } catch (_) {
    return { ...DEFAULTS };
  }
}

function show(values) {
  for (const [id, value] of Object.entries(values)) {
    const input = $(id);
    if (!input) continue;
    if (input.type === "checkbox") input.checked = Boolean(value);
    else input.value = value;
  }
}

function current() {
  const values = {};
  for (const id of Object.keys(DEFAULTS)) {
    const input = $(id);
    values[id] = input.type === "checkbox" ? input.checked : input.value;
  }
  return values;
}

/** Fills the panel from localStorage and keeps it there; `onKeyChange` runs when the key changes. */
export function initSettings(onKeyChange) {
  show(stored());
  $("settings-form").addEventListener("input", () => localStorage.setItem(SETTINGS_KEY, JSON.stringify(current())));
  $("settings-reset").addEventListener("click", () => {
    show(DEFAULTS);
    localStorage.removeItem(SETTINGS_KEY);
  });
  const key = $("api-key");
  key.value = localStorage.getItem(KEY_STORAGE) || "";
  key.addEventListener("change", () => {
    localStorage.setItem(KEY_STORAGE, key.value.trim());
    onKeyChange();
  });
}

export function apiKey() {
  return $("api-key").value.trim();
}

export function openSettings() {
  $("settings").open = true;
}

/** Shows the reasoning switch only for a model with a reasoning channel. */
export function setReasoningAvailable(available) {
  $("think-label").hidden = !available;
}

/**
 * What the settings add to a chat completion request: the system prompt (a first message, or
 * null), the sampling fields that are set, and reasoning_effort when reasoning is on and the
 * model has it.
 */
export function requestSettings() {
  const fields = {};
  for (const [id, name] of Object.entries(NUMBER_FIELDS)) {
    const text = $(id).value.trim();
    if (text !== "") fields[name] = Number(text);
  }
  if (!$("think-label").hidden && $("think").checked) fields.reasoning_effort = REASONING_EFFORT;
  const system = $("system").value.trim();
  return { system: system ? { role: "system", content: system } : null, fields };
}
