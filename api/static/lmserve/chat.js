// The chat page: the open conversation, sending a message and streaming its reply, Stop (it
// aborts the fetch; the server notices the hang-up and frees the worker), Regenerate, editing a
// user message (it resubmits from there and drops what followed), Copy, and the model's
// capabilities from /health. Storage, rendering, settings, the sidebar and the server's state
// are modules beside it.

import { fetchModel, streamChat } from "./api.js";
import { copyWithFeedback } from "./clipboard.js";
import { refreshHealth } from "./health.js";
import { messageNode, openEditor, renderReply } from "./messages.js";
import { apiKey, initSettings, openSettings, requestSettings } from "./settings.js";
import { initSidebar, renderSidebar } from "./sidebar.js";
import * as store from "./store.js";

const HEALTH_EVERY_MS = 2000;
const $ = (id) => document.getElementById(id);
let conversation = store.newConversation(); // the open one; stored once it has a message
let controller = null; // the AbortController of the reply streaming now

function showError(text) {
  const box = $("error");
  box.textContent = text || "";
  box.hidden = !text;
}

function describe(failure) {
  if (failure.status === 401) {
    openSettings(); // where the key goes
    return "this server needs its API key (Settings): " + failure.message;
  }
  return failure.message;
}

// localStorage can be full (about 5 MB per origin): say so rather than lose the reply silently.
function persist(target) {
  try {
    store.saveConversation(target);
    return true;
  } catch (err) {
    showError("could not save the conversation in this browser: " + err.message);
    return false;
  }
}

// -- the open conversation -------------------------------------------------------------------
function actionsFor(message, index, last) {
  const actions = ["copy"];
  if (message.role === "user") actions.push("edit");
  if (index === last) actions.push(message.role === "assistant" ? "regenerate" : "retry");
  return actions;
}

function renderConversation() {
  const last = conversation.messages.length - 1;
  const nodes = conversation.messages.map((m, i) => messageNode(m, i, actionsFor(m, i, last)));
  $("messages").replaceChildren(...nodes);
  if (nodes.length) nodes[nodes.length - 1].scrollIntoView({ block: "end" });
  renderSidebar(store.findConversation(conversation.id) ? conversation.id : null);
}

function openConversation(id) {
  if (controller) controller.abort();
  const found = id && store.findConversation(id);
  conversation = found || store.newConversation();
  store.setCurrentId(found ? id : null);
  showError("");
  renderConversation();
}

function requestBody(messages) {
  const { system, fields } = requestSettings();
  const wire = messages.map((m) => ({ role: m.role, content: m.content }));
  return {
    model: $("model").dataset.id || "default",
    messages: system ? [system, ...wire] : wire,
    stream: true,
    stream_options: { include_usage: true },
    ...fields,
  };
}

// Streams the reply to the open conversation (which ends with a user message) into a new node.
async function generate() {
  const target = conversation;
  const body = requestBody(target.messages);
  const node = messageNode({ role: "assistant", content: "" }, null, []);
  $("messages").appendChild(node);
  node.scrollIntoView({ block: "end" });
  const reply = { role: "assistant", content: "", reasoning: "" };
  let failure = null;
  showError("");
  controller = new AbortController();
  setBusy(true);
  try {
    reply.stats = await streamChat(body, apiKey(), controller.signal, (content, reasoning) => {
      reply.content += content;
      reply.reasoning += reasoning;
      renderReply(node, reply);
      node.scrollIntoView({ block: "end" });
    });
  } catch (err) {
    if (err.name === "AbortError") reply.stats = { stopped: true };
    else failure = err;
  } finally {
    controller = null;
    setBusy(false);
    refreshHealth();
  }
  if (failure) {
    // What streamed before the error is shown (marked failed) until the next render; the user
    // message offers Retry either way.
    if (reply.content) node.classList.add("failed");
    else node.remove();
    showError(describe(failure));
    return;
  }
  // A stopped reply stays as far as it got; one deleted while it streamed stays deleted.
  if (reply.content && store.findConversation(target.id)) {
    target.messages.push(reply);
    persist(target);
  }
  if (target === conversation) renderConversation();
}

function send(text) {
  conversation.messages.push({ role: "user", content: text });
  if (!persist(conversation)) return;
  store.setCurrentId(conversation.id);
  renderConversation();
  generate();
}

function regenerate() {
  const messages = conversation.messages;
  if (messages.length && messages[messages.length - 1].role === "assistant") messages.pop();
  if (!messages.length) return;
  persist(conversation);
  renderConversation();
  generate();
}

function resubmit(index, text) {
  conversation.messages = [...conversation.messages.slice(0, index), { role: "user", content: text }];
  persist(conversation);
  renderConversation();
  generate();
}

function onMessageAction(event) {
  const target = event.target.closest("button[data-action]");
  if (!target) return;
  const node = target.closest(".msg");
  const index = Number(node.dataset.index);
  const action = target.dataset.action;
  if (action === "copy-code") copyWithFeedback(target, target.nextElementSibling.textContent);
  else if (action === "copy") copyWithFeedback(target, conversation.messages[index].content);
  else if (controller) return; // nothing below while a reply streams
  else if (action === "edit") openEditor(node, conversation.messages[index].content);
  else if (action === "edit-cancel") renderConversation();
  else if (action === "edit-send") {
    const text = node.querySelector(".edit-text").value.trim();
    if (text) resubmit(index, text);
  } else if (action === "regenerate" || action === "retry") regenerate();
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.classList.toggle("busy", busy);
}

// -- the model ---------------------------------------------------------------------------------
async function loadModel() {
  try {
    const model = await fetchModel(apiKey());
    $("model").textContent = model.id;
    $("model").dataset.id = model.id;
  } catch (err) {
    if (err.status === 401) showError(describe(err));
  }
}

function init() {
  initSettings(() => {
    showError("");
    loadModel();
  });
  initSidebar({
    open: openConversation,
    openId: () => (store.findConversation(conversation.id) ? conversation.id : null),
    deleted: (id) => {
      if (id === conversation.id) openConversation(null);
      else renderConversation();
    },
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
  $("new-chat").addEventListener("click", () => {
    openConversation(null);
    $("prompt").focus();
  });
  $("messages").addEventListener("click", onMessageAction);
  openConversation(store.currentId());
  refreshHealth();
  loadModel();
  setInterval(refreshHealth, HEALTH_EVERY_MS);
}

init(); // a module runs once the document is parsed
