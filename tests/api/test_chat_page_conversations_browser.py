"""The chat page's conversation features in a real headless Chromium against a live server with
the real model generating: conversations kept in localStorage (sidebar, new, open, rename,
delete, the open one surviving a reload), Regenerate and editing a user message, Copy buttons
(read back from the clipboard, with and without the Clipboard API), the settings panel (what it
sends, checked on the requests the page makes and on what the server did with them), and the
reasoning switch following /health. Screenshots are kept under ``test-artifacts/``."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.think_gguf import ANSWER_TEXT, think_model_path

from .conftest import start_lmserve
from .test_admin_browser import artifacts_dir, chromium_page  # noqa: F401  (a fixture)
from .test_chat_page_browser import REPLY, STATS, open_page, open_settings, send, wait_reply_done

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

CODE_PROMPT = "Write a Python function that adds two numbers."
# What SmolLM2 writes greedily for CODE_PROMPT: a fenced block first (one exact arithmetic makes
# a greedy reply the same on every run and every machine).
CODE_BLOCK = "def add_two_numbers(num1, num2):\n    return num1 + num2"
VIEWPORT = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def model_server(tmp_path_factory):
    server = start_lmserve(tmp_path_factory.mktemp("chat-page"), "--ctx", "1024", "--kv-slots", "2")
    yield server
    server.stop()


@pytest.fixture
def page(model_server, chromium_page):  # noqa: F811
    """The chat page on the module's server, settled on short greedy replies."""
    model_server.wait_idle()
    chromium_page.set_viewport_size(VIEWPORT)
    open_page(chromium_page, model_server, model_server.health()["model"])
    set_fields(chromium_page, {"#max-tokens": "24", "#temperature": "0"})
    return chromium_page


def set_fields(page, values: dict[str, str]) -> None:
    open_settings(page)
    for selector, value in values.items():
        page.fill(selector, value)
    page.evaluate("() => { document.getElementById('settings').open = false; }")


def stored(page, key: str):
    return page.evaluate("k => JSON.parse(localStorage.getItem(k))", key)


def current_id(page) -> str | None:
    return page.evaluate("() => localStorage.getItem('lmserve.current')")


def chat_requests(page) -> list[dict]:
    """The bodies of the chat completion requests the page sends from now on."""
    bodies: list[dict] = []

    def record(request) -> None:
        if request.method == "POST" and request.url.endswith("/v1/chat/completions"):
            bodies.append(request.post_data_json)

    page.on("request", record)
    return bodies


def sidebar_titles(page) -> list[str]:
    return page.eval_on_selector_all("#conversations li .open", "nodes => nodes.map(n => n.textContent)")


def shown_messages(page) -> list[tuple[str, str]]:
    """(role, text) of every message on the page."""
    shown = page.eval_on_selector_all(
        "#messages .msg",
        "nodes => nodes.map(n => [n.classList.contains('user') ? 'user' : 'assistant',"
        " n.querySelector('.content').textContent])",
    )
    return [tuple(message) for message in shown]


def ask(page, text: str) -> dict:
    send(page, text)
    return wait_reply_done(page)


def test_conversations_are_kept_renamed_deleted_and_survive_a_reload(page, model_server):
    assert stored(page, "lmserve.conversations") is None and current_id(page) is None
    stats = ask(page, "Name three colors.")
    [first] = stored(page, "lmserve.conversations")
    assert current_id(page) == first["id"]
    assert first["title"] == "Name three colors." and not first["renamed"]
    assert [m["role"] for m in first["messages"]] == ["user", "assistant"]
    reply = first["messages"][1]
    assert reply["content"].strip() and str(reply["stats"]["tokens"]) == stats["tokens"]
    assert sidebar_titles(page) == ["Name three colors."]
    assert page.get_attribute("#conversations li", "aria-current") == "true"
    before = shown_messages(page)

    page.reload()
    page.wait_for_selector(STATS)
    assert shown_messages(page) == before, "the open conversation did not survive the reload"
    assert page.text_content(STATS) == stats["text"], "the reply's statistics did not survive the reload"
    assert page.input_value("#max-tokens") == "24", "the settings did not survive the reload"

    page.click("#new-chat")
    assert shown_messages(page) == [] and current_id(page) is None
    assert page.get_attribute("#conversations li", "aria-current") is None
    ask(page, "Say hello.")
    second = stored(page, "lmserve.conversations")[0]
    assert second["title"] == "Say hello." and current_id(page) == second["id"]
    assert sidebar_titles(page) == ["Say hello.", "Name three colors."], "the newest first"

    page.click(f"#conversations li[data-id='{first['id']}'] .open")
    assert shown_messages(page) == before and current_id(page) == first["id"]
    page.reload()
    page.wait_for_selector(STATS)
    assert shown_messages(page) == before, "the conversation opened last is the one a reload shows"

    item = f"#conversations li[data-id='{first['id']}']"
    page.click(item + " [data-action=rename]")
    page.fill(item + " input.rename", "Colours")
    page.press(item + " input.rename", "Enter")
    assert page.text_content(item + " .open") == "Colours"
    other = f"#conversations li[data-id='{second['id']}']"
    page.click(other + " [data-action=rename]")
    page.fill(other + " input.rename", "never kept")
    page.press(other + " input.rename", "Escape")
    assert page.text_content(other + " .open") == "Say hello."
    ask(page, "And two more?")
    kept = {c["id"]: c for c in stored(page, "lmserve.conversations")}
    assert kept[first["id"]]["title"] == "Colours" and kept[first["id"]]["renamed"]
    assert len(kept[first["id"]]["messages"]) == 4, "a follow-up goes into the open conversation"
    assert kept[second["id"]]["title"] == "Say hello." and len(kept[second["id"]]["messages"]) == 2
    page.reload()
    page.wait_for_selector(STATS)
    assert sidebar_titles(page) == ["Colours", "Say hello."] and len(shown_messages(page)) == 4
    page.screenshot(path=str(artifacts_dir() / "chat-page-conversations.png"))

    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click(other + " [data-action=delete]")
    assert len(stored(page, "lmserve.conversations")) == 2, "a dismissed confirmation deletes nothing"
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(item + " [data-action=delete]")
    assert [c["id"] for c in stored(page, "lmserve.conversations")] == [second["id"]]
    assert sidebar_titles(page) == ["Say hello."]
    assert shown_messages(page) == [] and current_id(page) is None, "deleting the open one opens a new one"
    page.reload()
    assert sidebar_titles(page) == ["Say hello."] and shown_messages(page) == []


def test_regenerate_and_edit_resubmit_from_there(page, model_server):
    bodies = chat_requests(page)
    ask(page, "Name three colors.")
    first_reply = shown_messages(page)[1][1]
    page.evaluate(f"() => {{ document.querySelector('{REPLY}').dataset.old = '1'; }}")
    assert len(page.query_selector_all("[data-action=regenerate]")) == 1, "only the last reply regenerates"

    tokens_before = model_server.health()["tokens_generated"]
    page.click(REPLY + " [data-action=regenerate]")
    wait_reply_done(page)
    assert page.get_attribute(REPLY, "data-old") is None, "the reply was not generated again"
    assert model_server.health()["tokens_generated"] > tokens_before
    assert bodies[1]["messages"] == [{"role": "user", "content": "Name three colors."}], (
        "the old reply was sent"
    )
    assert shown_messages(page) == [("user", "Name three colors."), ("assistant", first_reply)], (
        "greedy: the same reply"
    )
    assert len(stored(page, "lmserve.conversations")[0]["messages"]) == 2

    ask(page, "Which one is the warmest?")
    assert len(page.query_selector_all("#messages .msg")) == 4
    first_user = "#messages .msg[data-index='0']"
    page.click(first_user + " [data-action=edit]")
    assert page.input_value(first_user + " .edit-text") == "Name three colors."
    page.click(first_user + " [data-action=edit-cancel]")
    assert len(shown_messages(page)) == 4 and shown_messages(page)[0] == ("user", "Name three colors.")

    page.click(first_user + " [data-action=edit]")
    page.fill(first_user + " .edit-text", "Name two animals.")
    page.click(first_user + " [data-action=edit-send]")
    wait_reply_done(page)
    assert bodies[-1]["messages"] == [{"role": "user", "content": "Name two animals."}], (
        "what followed was sent"
    )
    shown = shown_messages(page)
    assert [role for role, _ in shown] == ["user", "assistant"] and shown[0][1] == "Name two animals."
    messages = stored(page, "lmserve.conversations")[0]["messages"]
    assert [m["content"] for m in messages] == ["Name two animals.", messages[1]["content"]]
    assert messages[1]["content"].strip() and messages[1]["content"] != first_reply
    assert len(bodies) == 4
    page.screenshot(path=str(artifacts_dir() / "chat-page-edited.png"))


def test_copy_buttons_put_the_text_on_the_clipboard(page, model_server):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=model_server.url)
    set_fields(page, {"#max-tokens": "40"})
    ask(page, CODE_PROMPT)
    stored_reply = stored(page, "lmserve.conversations")[0]["messages"][1]["content"]
    assert stored_reply.startswith("```python\n" + CODE_BLOCK + "\n```")

    page.click(REPLY + " .code-block [data-action=copy-code]")
    assert page.evaluate("navigator.clipboard.readText()") == CODE_BLOCK
    assert page.text_content(REPLY + " .code-block [data-action=copy-code]") == "Copied"
    page.click(REPLY + " .actions [data-action=copy]")
    assert page.evaluate("navigator.clipboard.readText()") == stored_reply, "the reply's Markdown as written"

    # Without the Clipboard API (a server reached over plain http is no secure context), the
    # selection fallback copies.
    page.evaluate("""() => {
      window.realClipboard = navigator.clipboard;
      Object.defineProperty(Navigator.prototype, 'clipboard', {get: () => undefined, configurable: true});
      return window.realClipboard.writeText('-');
    }""")
    assert page.evaluate("navigator.clipboard") is None
    page.click(".msg.user [data-action=copy]")
    assert page.evaluate("window.realClipboard.readText()") == CODE_PROMPT
    assert page.get_attribute(".msg.user [data-action=copy]", "data-copied") == "true"
    page.screenshot(path=str(artifacts_dir() / "chat-page-copy.png"))


def test_settings_are_kept_and_sent_with_every_request(page, model_server):
    bodies = chat_requests(page)
    settings = {
        "#system": "You are a pirate.",
        "#temperature": "0.3",
        "#top-p": "0.9",
        "#top-k": "20",
        "#min-p": "0.05",
        "#max-tokens": "8",
        "#seed": "42",
    }
    set_fields(page, settings)
    kept = stored(page, "lmserve.settings")
    assert {"#" + name: value for name, value in kept.items() if name != "think"} == settings
    stats = ask(page, "Who are you?")
    [body] = bodies
    assert body["messages"] == [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Who are you?"},
    ]
    expected = {"temperature": 0.3, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "max_tokens": 8, "seed": 42}
    assert {name: body[name] for name in expected} == expected
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "reasoning_effort" not in body, "SmolLM2 has no reasoning channel"
    assert int(stats["tokens"]) <= 8, "the server did not get max_tokens"

    page.reload()
    assert {selector: page.input_value(selector) for selector in settings} == settings
    set_fields(page, {"#top-k": "", "#seed": ""})
    ask(page, "And your ship?")
    assert "top_k" not in bodies[1] and "seed" not in bodies[1], "an empty field is left to the server"
    assert bodies[1]["messages"][0] == {"role": "system", "content": "You are a pirate."}
    assert bodies[1]["top_p"] == 0.9

    set_fields(page, {"#top-p": "5"})  # the input's max is 1, but a typed value is sent as typed
    send(page, "Hello?")
    page.wait_for_selector("#error:not([hidden])")
    assert "top_p" in page.text_content("#error"), "the server's 400 names the field"
    failed_turn = "#messages .msg[data-index='4']"
    assert page.is_visible(failed_turn + " [data-action=retry]"), "a failed reply can be retried"
    assert len(stored(page, "lmserve.conversations")[0]["messages"]) == 5, "the user's message is kept"
    page.screenshot(path=str(artifacts_dir() / "chat-page-settings.png"))

    open_settings(page)
    page.click("#settings-reset")
    assert page.input_value("#system") == "" and page.input_value("#top-p") == ""
    assert page.input_value("#temperature") == "0.7" and page.input_value("#max-tokens") == "512"
    assert stored(page, "lmserve.settings") is None
    set_fields(page, {"#max-tokens": "8"})
    page.click(failed_turn + " [data-action=retry]")
    wait_reply_done(page)
    assert page.is_hidden("#error") and not page.query_selector_all(".msg.failed")
    assert (
        bodies[-1]["max_tokens"] == 8
        and "top_p" not in bodies[-1]
        and bodies[-1]["messages"][0]["role"] == "user"
    )
    assert len(stored(page, "lmserve.conversations")[0]["messages"]) == 6


def test_the_reasoning_switch_follows_health(start_server, chromium_page, synthetic_dir, model_server):  # noqa: F811
    page = chromium_page
    page.set_viewport_size(VIEWPORT)
    open_page(page, model_server, model_server.health()["model"])
    page.wait_for_selector("#caps .badge")
    capabilities = model_server.health()["capabilities"]
    badges = page.eval_on_selector_all("#caps .badge", "nodes => nodes.map(n => n.textContent)")
    assert badges[:2] == [f"ctx {capabilities['ctx']}", f"{capabilities['kv_slots']} KV slots"]
    labels = {
        "reasoning": "reasoning",
        "tools": "tools",
        "grammar": "grammar",
        "kv_reuse": "KV reuse",
        "spec": "spec",
        "batch": "batch",
    }
    assert badges[2:] == [label for name, label in labels.items() if capabilities[name]]
    open_settings(page)
    assert not capabilities["reasoning"] and page.is_hidden("#think-label")
    # A switch left on (stored while another model was served) asks nothing of this one.
    page.evaluate(
        "() => localStorage.setItem('lmserve.settings', JSON.stringify({think: true, 'max-tokens': '4'}))"
    )
    bodies = chat_requests(page)
    page.reload()
    page.wait_for_selector("#caps .badge")
    assert page.is_checked("#think") and page.is_hidden("#think-label")
    ask(page, "Hi.")
    assert "reasoning_effort" not in bodies[0]

    server = start_server(str(think_model_path(synthetic_dir)), "--ctx", "512")
    assert server.health()["capabilities"]["reasoning"]
    open_page(page, server, server.health()["model"])  # another origin: another localStorage
    open_settings(page)
    page.wait_for_selector("#think-label:not([hidden])")
    assert "reasoning" in page.eval_on_selector_all("#caps .badge", "nodes => nodes.map(n => n.textContent)")
    send(page, "Where should I go?")
    wait_reply_done(page)
    assert "reasoning_effort" not in bodies[1], "reasoning is off until switched on"
    assert page.is_hidden(REPLY + " details.reasoning")
    page.check("#think")
    assert stored(page, "lmserve.settings")["think"] is True
    page.click(REPLY + " [data-action=regenerate]")
    wait_reply_done(page)
    assert bodies[2]["reasoning_effort"] == "medium"
    assert page.text_content(REPLY + " .content").strip() == ANSWER_TEXT
    assert page.is_visible(REPLY + " details.reasoning")
    page.reload()
    open_settings(page)
    page.wait_for_selector("#think-label:not([hidden])")
    assert page.is_checked("#think"), "the switch is kept"
    assert page.is_visible(REPLY + " details.reasoning"), "the reasoning is kept with the reply"
    assert json.loads(page.evaluate("() => localStorage.getItem('lmserve.conversations')"))[0]["messages"][1][
        "reasoning"
    ]
    page.screenshot(path=str(artifacts_dir() / "chat-page-reasoning-switch.png"))
