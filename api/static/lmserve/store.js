// Conversations kept in this browser's localStorage: every conversation in one JSON array
// under "lmserve.conversations" (most recently changed first) and the id of the open one under
// "lmserve.current". A conversation is {id, title, renamed, updated, messages}; a message is
// {role, content} as the API takes it, and an assistant's also keeps what the page shows again
// after a reload: its reasoning and its statistics.

const LIST_KEY = "lmserve.conversations";
const CURRENT_KEY = "lmserve.current";
const TITLE_CHARS = 48;

function read() {
  try {
    const list = JSON.parse(localStorage.getItem(LIST_KEY) || "[]");
    return Array.isArray(list) ? list : [];
  } catch (_) {
    return []; // a damaged entry (edited by hand) starts an empty list rather than a dead page
  }
}

function write(list) {
  localStorage.setItem(LIST_KEY, JSON.stringify(list));
}

// Not crypto.randomUUID: it exists only in secure contexts, and a server on the LAN over plain
// http is not one.
function newId() {
  return Date.now().toString(36) + "-" + Math.random().toString(36).slice(2, 10);
}

/** A title from a conversation's first message: its first line, cut short. */
export function titleFrom(text) {
  const line = text.trim().split("\n")[0].trim();
  return line.length > TITLE_CHARS ? line.slice(0, TITLE_CHARS - 1) + "…" : line || "New conversation";
}

/** Every stored conversation, most recently changed first. */
export function allConversations() {
  return read();
}

export function findConversation(id) {
  return read().find((c) => c.id === id) || null;
}

/** A new, not yet stored conversation (it is stored by its first `saveConversation`). */
export function newConversation() {
  return { id: newId(), title: "", renamed: false, updated: Date.now(), messages: [] };
}

/**
 * Stores a conversation (first in the list). A title given in the sidebar since it was loaded
 * is kept; an unrenamed conversation is titled by its first message.
 */
export function saveConversation(conversation) {
  const list = read();
  const before = list.find((c) => c.id === conversation.id);
  if (before && before.renamed) Object.assign(conversation, { title: before.title, renamed: true });
  if (!conversation.renamed && conversation.messages.length)
    conversation.title = titleFrom(conversation.messages[0].content);
  conversation.updated = Date.now();
  write([conversation, ...list.filter((c) => c.id !== conversation.id)]);
}

export function renameConversation(id, title) {
  const list = read();
  const conversation = list.find((c) => c.id === id);
  if (!conversation || !title.trim()) return;
  conversation.title = title.trim();
  conversation.renamed = true;
  write(list);
}

export function deleteConversation(id) {
  write(read().filter((c) => c.id !== id));
  if (currentId() === id) setCurrentId(null);
}

/** The id of the conversation open in the page, or null for a new one. */
export function currentId() {
  return localStorage.getItem(CURRENT_KEY);
}

export function setCurrentId(id) {
  if (id) localStorage.setItem(CURRENT_KEY, id);
  else localStorage.removeItem(CURRENT_KEY);
}
