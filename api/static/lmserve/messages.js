// The messages of the open conversation as DOM nodes: a user's text as typed, an assistant's as
// Markdown with its reasoning folded away and its statistics, a row of actions under each
// (buttons with data-action, handled by the page), and a Copy button on every code block.

import { renderMarkdown } from "./markdown.js";

const ACTION_LABELS = { copy: "Copy", edit: "Edit", regenerate: "Regenerate", retry: "Retry" };

function button(action, label, title) {
  const b = document.createElement("button");
  b.type = "button";
  b.dataset.action = action;
  b.textContent = label;
  if (title) b.title = title;
  return b;
}

/** A message's node; `index` is its place in the conversation, `actions` names its buttons. */
export function messageNode(message, index, actions) {
  const node = document.createElement("article");
  node.className = "msg " + message.role;
  if (index !== null) node.dataset.index = index;
  if (message.role === "assistant") {
    node.innerHTML =
      '<details class="reasoning" hidden><summary>Reasoning</summary><div class="reasoning-text"></div></details>' +
      '<div class="content"></div><div class="stats"></div>';
    renderReply(node, message);
    if (message.stats) showStats(node, message.stats);
  } else {
    node.innerHTML = '<div class="content"></div>';
    node.querySelector(".content").textContent = message.content;
  }
  const bar = document.createElement("div");
  bar.className = "actions";
  for (const action of actions) bar.appendChild(button(action, ACTION_LABELS[action]));
  node.appendChild(bar);
  return node;
}

/** Renders an assistant's reply (also while it streams): Markdown, code Copy buttons, reasoning. */
export function renderReply(node, reply) {
  const content = node.querySelector(".content");
  content.innerHTML = renderMarkdown(reply.content);
  for (const pre of content.querySelectorAll("pre")) {
    const block = document.createElement("div");
    block.className = "code-block";
    pre.replaceWith(block);
    block.append(button("copy-code", "Copy", "copy this code"), pre);
  }
  if (reply.reasoning) {
    const details = node.querySelector(".reasoning");
    details.hidden = false;
    details.querySelector(".reasoning-text").textContent = reply.reasoning;
  }
}

/** The per-reply statistics, as text and as data attributes (the page's tests read those). */
export function showStats(node, stats) {
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

/** Turns a user message's node into an editor of its text (Send resubmits from there). */
export function openEditor(node, text) {
  const content = node.querySelector(".content");
  content.innerHTML = "";
  const area = document.createElement("textarea");
  area.className = "edit-text";
  area.value = text;
  area.rows = Math.min(12, text.split("\n").length + 1);
  content.appendChild(area);
  node.querySelector(".actions").replaceChildren(
    button("edit-send", "Send", "replace this message and everything after it"),
    button("edit-cancel", "Cancel")
  );
  area.focus();
}
