// A small Markdown renderer for model replies: fenced code blocks, headings, lists, block
// quotes, rules, paragraphs, and inline code, bold, italic and http(s) links. Every piece of
// text is HTML-escaped before any tag is added, so a reply can never inject markup. An
// unterminated code fence (a reply still streaming) renders as a code block to the end.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// Inline markup over already-escaped text; code spans are set aside first so nothing inside
// them is interpreted.
function inline(text) {
  const spans = [];
  let html = escapeHtml(text).replace(/`([^`]+)`/g, (_, code) => {
    spans.push("<code>" + code + "</code>");
    return "\u0000" + (spans.length - 1) + "\u0000";
  });
  html = html
    .replace(/\*\*(?=\S)(.+?)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*(?=\S)([^*]+?)\*(?!\w)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_(?=\S)([^_]+?)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
  return html.replace(/\u0000(\d+)\u0000/g, (_, i) => spans[Number(i)]);
}

const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;

function codeBlock(lines, language) {
  const cls = language ? ' class="language-' + escapeHtml(language) + '"' : "";
  return "<pre><code" + cls + ">" + escapeHtml(lines.join("\n")) + "</code></pre>";
}

function list(items, ordered) {
  const tag = ordered ? "ol" : "ul";
  return "<" + tag + ">" + items.map((item) => "<li>" + inline(item) + "</li>").join("") + "</" + tag + ">";
}

// Consumes consecutive lines matching `pattern`, returning their captured text.
function take(lines, start, pattern) {
  const items = [];
  let i = start;
  for (; i < lines.length; i++) {
    const m = pattern.exec(lines[i]);
    if (!m) break;
    items.push(m[1]);
  }
  return [items, i];
}

export function renderMarkdown(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) out.push("<p>" + paragraph.map(inline).join("<br>") + "</p>");
    paragraph = [];
  };
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      flush();
      const body = [];
      for (i++; i < lines.length && !new RegExp("^\\s*" + fence[1] + "\\s*$").test(lines[i]); i++) body.push(lines[i]);
      out.push(codeBlock(body, fence[2]));
      i++;
      continue;
    }
    let m;
    if (!line.trim()) {
      flush();
      i++;
    } else if ((m = HEADING.exec(line))) {
      flush();
      const level = m[1].length;
      out.push("<h" + level + ">" + inline(m[2]) + "</h" + level + ">");
      i++;
    } else if (RULE.test(line)) {
      flush();
      out.push("<hr>");
      i++;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      flush();
      const ordered = !BULLET.test(line);
      let items;
      [items, i] = take(lines, i, ordered ? NUMBERED : BULLET);
      out.push(list(items, ordered));
    } else if (QUOTE.test(line)) {
      flush();
      let quoted;
      [quoted, i] = take(lines, i, QUOTE);
      out.push("<blockquote>" + renderMarkdown(quoted.join("\n")) + "</blockquote>");
    } else {
      paragraph.push(line);
      i++;
    }
  }
  flush();
  return out.join("\n");
}

