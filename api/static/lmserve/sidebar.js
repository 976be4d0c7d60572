// The list of stored conversations in the sidebar: open one, rename it in place (Enter keeps
// the new title, Escape drops it), delete it (after a confirmation).

import { allConversations, deleteConversation, renameConversation } from "./store.js";

const $ = (id) => document.getElementById(id);
let handlers = null; // {open(id), deleted(id)} from the page

function item(conversation, openId) {
  const li = document.createElement("li");
  li.dataset.id = conversation.id;
  if (conversation.id === openId) {
    li.className = "current";
    li.setAttribute("aria-current", "true");
  }
  li.innerHTML =
    '<button type="button" class="open" data-action="open"></button>' +
    '<button type="button" class="icon" data-action="rename" title="rename">✎</button>' +
    '<button type="button" class="icon" data-action="delete" title="delete">✕</button>';
  const open = li.querySelector(".open");
  open.textContent = conversation.title;
  open.title = conversation.title;
  return li;
}

/** Draws the list, marking the conversation `openId` as the open one. */
export function renderSidebar(openId) {
  $("conversations").replaceChildren(...allConversations().map((c) => item(c, openId)));
}

function startRename(li) {
  const open = li.querySelector(".open");
  const input = document.createElement("input");
  input.className = "rename";
  input.value = open.textContent;
  input.setAttribute("aria-label", "new title");
  open.replaceWith(input);
  input.select();
  let done = false;
  const finish = (keep) => {
    if (done) return;
    done = true;
    if (keep) renameConversation(li.dataset.id, input.value);
    renderSidebar(handlers.openId());
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    else if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
}

/** Wires the list; `page` says which conversation is open and opens or forgets one. */
export function initSidebar(page) {
  handlers = page;
  $("conversations").addEventListener("click", (event) => {
    const target = event.target.closest("button[data-action]");
    if (!target) return;
    const li = target.closest("li");
    const id = li.dataset.id;
    if (target.dataset.action === "open") page.open(id);
    else if (target.dataset.action === "rename") startRename(li);
    else if (target.dataset.action === "delete") {
      const title = li.querySelector(".open").textContent;
      if (!window.confirm("Delete the conversation “" + title + "”?")) return;
      deleteConversation(id);
      page.deleted(id);
    }
  });
}
