"""The chat page at ``/`` in a real headless Chromium (Debian's, driven by Playwright as in
test_admin_browser.py): a message streams in with its statistics, a follow-up reuses the KV
rows, Stop really frees the worker, an API-key server works once the key is typed, and a
reasoning model's thinking lands in its collapsible block. Screenshots are kept under
``test-artifacts/``."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fixtures.think_gguf import ANSWER_TEXT, THINK_TEXT, think_model_path

from .conftest import API_KEY
from .test_admin_browser import artifacts_dir, chromium_page  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REPLY = ".msg.assistant:last-of-type"
STATS = REPLY + " .stats"
# Counts the renders of the newest reply, to tell a streamed reply from one that arrived whole.
COUNT_RENDERS = """() => {
  window.renders = 0;
  new MutationObserver(() => { window.renders += 1; })
    .observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
}"""
# The page's Markdown renderer is an ES module: imported, as the page imports it.
RENDER_MARKDOWN = "async t => (await import('/static/lmserve/markdown.js')).renderMarkdown(t)"


def open_page(page, server, model_id: str | None = None) -> None:
    page.goto(server.url + "/")
    if model_id is not None:
        page.wait_for_function("id => document.getElementById('model').dataset.id === id", arg=model_id)


def open_settings(page) -> None:
    page.evaluate("() => { document.getElementById('settings').open = true; }")


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.click("#send")


def wait_reply_done(page, timeout_ms: int = 180_000) -> dict:
    page.wait_for_selector("#send:not([disabled])", timeout=timeout_ms)
    return page.eval_on_selector(STATS, "e => ({...e.dataset, text: e.textContent})")


def test_a_message_streams_with_its_stats_and_a_follow_up_hits_the_cache(start_server, chromium_page):  # noqa: F811
    server = start_server("--ctx", "1024", "--kv-slots", "2")
    page = chromium_page
    model_id = server.health()["model"]
    open_page(page, server, model_id)
    assert page.text_content("#model") == model_id
    page.wait_for_selector("#caps .badge")
    assert "ctx 1024" in page.text_content("#caps") and "2 KV slots" in page.text_content("#caps")
    assert page.is_hidden("#think-label"), "SmolLM2 has no reasoning channel: no reasoning switch"

    page.evaluate(COUNT_RENDERS)
    send(page, "Write a short poem about the sea.")
    page.wait_for_selector("#stop:not([disabled])")
    stats = wait_reply_done(page)
    reply = page.text_content(REPLY + " .content")
    assert reply.strip(), "no reply text"
    assert page.evaluate("window.renders") > 3, "the reply was not rendered as it streamed"
    assert int(stats["tokens"]) > 1 and float(stats["tps"]) > 0 and float(stats["ttft"]) > 0
    assert stats["cached"] == "0" and "tok/s" in stats["text"] and "first token" in stats["text"]
    page.screenshot(path=str(artifacts_dir() / "chat-page.png"), full_page=True)

    send(page, "Now make it rhyme.")
    follow_up = wait_reply_done(page)
    assert int(follow_up["cached"]) > 0, "the follow-up turn did not reuse the first turn's KV rows"
    assert len(page.query_selector_all(".msg.user")) == 2


def test_markdown_renders_code_and_never_markup(start_server, chromium_page):  # noqa: F811
    server = start_server("--ctx", "256")
    page = chromium_page
    open_page(page, server)
    html = page.evaluate(
        RENDER_MARKDOWN,
        "# Title\n\nSome **bold** and `x < y` code.\n\n```python\nprint('<b>hi</b>')\n```\n\n"
        "- one\n- two\n\n<script>alert(1)</script> [link](https://example.com)",
    )
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html
    assert "<code>x &lt; y</code>" in html
    assert '<pre><code class="language-python">print(&#39;&lt;b&gt;hi&lt;/b&gt;&#39;)</code></pre>' in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert '<a href="https://example.com"' in html
    streaming = page.evaluate(RENDER_MARKDOWN, "Here:\n```js\nlet a = 1;")
    assert "<pre><code" in streaming, "an unterminated fence (still streaming) is code too"


def test_stop_cancels_the_generation_on_the_server(start_server, chromium_page):  # noqa: F811
    server = start_server("--ctx", "1024")
    page = chromium_page
    open_page(page, server, server.health()["model"])
    open_settings(page)
    page.fill("#max-tokens", "600")
    # Greedy: sampled at the page's default temperature, SmolLM2 sometimes answers "1 to 1000." and
    # stops; greedy, it counts on past 600 tokens.
    page.fill("#temperature", "0")
    before = server.health()["tokens_generated"]
    send(page, "Count from 1 to 1000, separated by commas.")
    page.wait_for_function(f"() => document.querySelector('{REPLY} .content').textContent.length > 20")
    assert server.health()["in_flight"] == 1
    assert page.is_enabled("#stop")
    stopped_at = time.monotonic()
    page.click("#stop")
    stats = wait_reply_done(page, 10_000)
    assert stats["stopped"] == "true" and "stopped" in stats["text"]
    idle = server.wait_idle(timeout=10)
    assert time.monotonic() - stopped_at < 10
    assert idle["tokens_generated"] - before < 600, "the generation ran to its end instead of stopping"
    page.wait_for_function("() => document.getElementById('status').dataset.inFlight === '0'")
    partial = page.text_content(REPLY + " .content")
    assert partial.strip(), "the text received before Stop stays on the page"


def test_api_key_mode(start_server, chromium_page):  # noqa: F811
    server = start_server("--api-key", API_KEY, "--ctx", "512")
    page = chromium_page
    response = page.goto(server.url + "/")
    assert response.status == 200, "the page itself is served without the key"
    page.wait_for_selector("#error:not([hidden])")
    assert "API key" in page.text_content("#error")
    assert page.is_visible("#api-key"), "a missing key opens the settings where it goes"
    assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401

    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")
    model_id = server.health()["model"]
    page.wait_for_function("id => document.getElementById('model').dataset.id === id", arg=model_id)
    assert page.is_hidden("#error")
    send(page, "Say hello.")
    stats = wait_reply_done(page)
    assert int(stats["tokens"]) > 0 and page.text_content(REPLY + " .content").strip()

    page.reload()
    assert page.input_value("#api-key") == API_KEY, "the key is kept in localStorage"
    open_settings(page)
    page.wait_for_function("id => document.getElementById('model').dataset.id === id", arg=model_id)
    page.fill("#api-key", "wrong-key")
    page.dispatch_event("#api-key", "change")
    send(page, "Say hello.")
    page.wait_for_selector("#error:not([hidden])")
    assert "invalid API key" in page.text_content("#error")


def test_reasoning_shows_in_its_collapsible_block(start_server, chromium_page, synthetic_dir):  # noqa: F811
    server = start_server(str(think_model_path(synthetic_dir)), "--ctx", "512")
    page = chromium_page
    open_page(page, server, server.health()["model"])
    open_settings(page)
    page.wait_for_selector("#think-label:not([hidden])")
    assert "reasoning" in page.text_content("#caps")
    page.check("#think")
    send(page, "Where should I go?")
    wait_reply_done(page)
    assert page.text_content(REPLY + " .content").strip() == ANSWER_TEXT
    block = page.query_selector(REPLY + " details.reasoning")
    assert block.is_visible() and block.get_attribute("open") is None, "reasoning starts collapsed"
    page.click(REPLY + " details.reasoning summary")
    assert page.text_content(REPLY + " .reasoning-text") == THINK_TEXT
    page.screenshot(path=str(artifacts_dir() / "chat-page-reasoning.png"), full_page=True)
