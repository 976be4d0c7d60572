// Copying text: the asynchronous Clipboard API where the browser offers it (secure contexts:
// https, localhost), else the old selection + execCommand("copy"), which also works on a
// server reached over plain http on the LAN.

function copyBySelection(text) {
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "offscreen";
  document.body.appendChild(area);
  area.select();
  try {
    return document.execCommand("copy");
  } finally {
    area.remove();
  }
}

/** Copies `text`; true when it reached the clipboard. */
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch (_) {
      // refused (no permission, page not focused): the selection may still work
    }
  }
  return copyBySelection(text);
}

/** Copies `text` and says so on `button` for a moment. */
export async function copyWithFeedback(button, text) {
  const copied = await copyText(text);
  const label = button.dataset.label || (button.dataset.label = button.textContent);
  button.textContent = copied ? "Copied" : "Copy failed";
  button.dataset.copied = copied;
  setTimeout(() => {
    button.textContent = label;
  }, 1500);
}
