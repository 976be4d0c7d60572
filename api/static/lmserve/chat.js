// The chat page: streams replies from this server's own /v1/chat/completions (fetch + a
// ReadableStream read as server-sent events), renders them as Markdown, shows reasoning in a
// collapsible block and per-reply statistics, and stops a reply by aborting its fetch (the
// server notices the hang-up and frees the worker).
"use strict";

(function () {
  const KEY_STORAGE = "lmserve.apiKey";
  const HEALTH_EVERY_MS = 2000;
  const $ = (id) => document.getElementById(id);
  const conversation = []; // {role, content} as sent to the API
  let controller = null; // the AbortController of the reply streaming now

  // -- the API ---------------------------------------------------------------------------
  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("api-key").value.trim();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      const message = body.error && body.error.message;
      if (response.status === 401) {
        $("settings").open = true; // where the key goes
        return "this server needs its API key (Settings): " + message;
      }
      return message || response.statusText;
    } catch (_) {
      return response.status + " " + response.statusText;
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

  // -- the page --------------------------------------------------------------------------
  function showError(text) {
    const box = $("error");
    box.textContent = text || "";
    box.hidden = !text;
  }

  function addMessage(role, text) {
    const node = document.createElement("article");
    node.className = "msg " + role;
    if (role === "assistant") {
      node.innerHTML =
        '<details class="reasoning" hidden><summary>Reasoning</summary><div class="reasoning-text"></div></details>' +
        '<div class="content"></div><div class="stats"></div>';
    } else {
      node.innerHTML = '<div class="content"></div>';
      node.querySelector(".content").textContent = text;
    }
    $("messages").appendChild(node);
    node.scrollIntoView({ block: "end" });
    return node;
  }

  function renderReply(node, reply) {
    node.querySelector(".content").innerHTML = window.renderMarkdown(reply.content);
    if (reply.reasoning) {
      const block = node.querySelector(".reasoning");
      block.hidden = false;
      block.querySelector(".reasoning-text").textContent = reply.reasoning;
    }
    node.scrollIntoView({ block: "end" });
  }

  function showStats(node, stats) {
    const el = node.querySelector(".stats");
    for (const [name, value] of Object.entries(stats)) el.dataset[name] = value;
    const parts = [];
    if (stats.stopped) parts.push("stopped");
    if (stats.tokens !== undefined) parts.push(stats.tokens + " tokens");
    if (stats.tps !== undefined) parts.push(stats.tps + " tok/s");
    if (stats.ttft !== undefined) parts.push("first token " + stats.ttft + " s");
    if (stats.cached !== undefined) parts.push(stats.cached + " cached");
    el.textContent = parts.join(" · ");
  }

  function requestBody() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...conversation);
    const body = {
      model: $("model").dataset.id || "default",
      messages,
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: Number($("max-tokens").value) || 512,
      temperature: Number($("temperature").value),
    };
    if (!$("think-label").hidden && $("think").checked) body.reasoning_effort = "medium";
    return body;
  }

  async function streamReply(node, reply) {
    const started = performance.now();
    let firstAt = null;
    let usage = null;
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(requestBody()),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const data of sseData(response.body)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
      const piece = (delta.content || "") + (delta.reasoning_content || "");
      if (!piece) continue;
      if (firstAt === null) firstAt = performance.now();
      reply.content += delta.content || "";
      reply.reasoning += delta.reasoning_content || "";
      renderReply(node, reply);
    }
    const ended = performance.now();
    const stats = { ttft: firstAt === null ? undefined : ((firstAt - started) / 1000).toFixed(2) };
    if (usage) {
      stats.tokens = usage.completion_tokens;
      stats.cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
      // The decode rate: the tokens after the first over the time after the first.
      if (firstAt !== null && usage.completion_tokens > 1 && ended > firstAt)
        stats.tps = ((usage.completion_tokens - 1) / ((ended - firstAt) / 1000)).toFixed(1);
    }
    showStats(node, stats);
  }

  async function send(text) {
    showError("");
    conversation.push({ role: "user", content: text });
    addMessage("user", text);
    const node = addMessage("assistant");
    const reply = { content: "", reasoning: "" };
    controller = new AbortController();
    setBusy(true);
    try {
      await streamReply(node, reply);
    } catch (err) {
      if (err.name === "AbortError") showStats(node, { stopped: true });
      else {
        showError(err.message);
        node.classList.add("failed");
      }
    } finally {
      controller = null;
      setBusy(false);
      refreshHealth();
      // A stopped reply stays in the conversation as far as it got; a failed one does not.
      if (reply.content && !node.classList.contains("failed")) conversation.push({ role: "assistant", content: reply.content });
      else if (!reply.content) conversation.pop();
    }
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
    document.body.classList.toggle("busy", busy);
  }

  // -- the model and the server's state ----------------------------------------------------
  function showCapabilities(caps) {
    const badges = [];
    if (caps.reasoning) badges.push("reasoning");
    if (caps.tools) badges.push("tools");
    if (caps.ctx) badges.push("ctx " + caps.ctx);
    if (caps.kv_slots) badges.push(caps.kv_slots + " KV slot" + (caps.kv_slots === 1 ? "" : "s"));
    $("caps").innerHTML = badges.map((b) => '<span class="badge">' + window.escapeHtml(b) + "</span>").join("");
    $("caps").dataset.reasoning = caps.reasoning;
    $("caps").dataset.tools = caps.tools;
    $("think-label").hidden = !caps.reasoning;
  }

  async function refreshHealth() {
    try {
      const health = await (await fetch("/health")).json();
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

  async function loadModel() {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) {
      if (response.status === 401) showError(await errorMessage(response));
      return;
    }
    const model = (await response.json()).data[0];
    $("model").textContent = model.id;
    $("model").dataset.id = model.id;
  }

  function init() {
    const key = $("api-key");
    key.value = localStorage.getItem(KEY_STORAGE) || "";
    key.addEventListener("change", () => {
      localStorage.setItem(KEY_STORAGE, key.value.trim());
      showError("");
      loadModel();
    });
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      const text = $("prompt").value.trim();
      if (!text || controller) return;
      $("prompt").value = "";
      send(text);
    });
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", () => controller && controller.abort());
    $("clear").addEventListener("click", () => {
      if (controller) controller.abort();
      conversation.length = 0;
      $("messages").innerHTML = "";
      showError("");
    });
    refreshHealth();
    loadModel();
    setInterval(refreshHealth, HEALTH_EVERY_MS);
  }

  document.addEventListener("DOMContentLoaded", init);
})();
