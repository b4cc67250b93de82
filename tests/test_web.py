"""The web chat end to end in headless Chromium against a real server over a socket.

The target is the tiny model made to answer with a scripted Markdown reply (conftest's `Scripted`: a code block, bold
text, a table), so the engine, the suffix drafter, the scheduler and the SSE stream all run for real while the reply
has something to render. The user's message holds the code the reply repeats, so the suffix drafter's drafts are
accepted and both kinds of token appear.

MLX_SPEC_SCREENSHOTS=DIR writes the page's screenshots (light, dark, narrow, overlay on and off) to DIR; those of
docs/server.md come from `MLX_SPEC_SCREENSHOTS=docs/screenshots .venv/bin/python -m pytest tests/test_web.py`.
"""

import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from conftest import ASK, CODE, health, scripted_pair, wait_for

from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running

CHROMIUM = shutil.which("chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Debian's chromium is not installed (setup.sh --dev installs it where it can: apt-get install chromium)",
    ),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def server(tiny_models):
    with Running(build_app(scripted_pair(tiny_models, pause=0.02), max_concurrency=2, max_tokens=200)) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def context(browser, server):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url.rstrip("/"))
    yield ctx
    ctx.close()


@pytest.fixture(scope="module")
def page(context, server):
    page = context.new_page()
    page.requests = []
    page.on("request", lambda r: page.requests.append(r.url))
    page.goto(server.url)
    page.wait_for_function("document.getElementById('drafter').options.length > 0")
    yield page


def shoot(page, name, tmp_path):
    """A screenshot, into MLX_SPEC_SCREENSHOTS when set (docs/server.md's), else the test's temporary folder."""
    folder = Path(os.environ.get("MLX_SPEC_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"web-{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 5_000
    return path


def ask(page, text, n_replies):
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_function(
        f"document.querySelectorAll('.msg.assistant .finish').length === {n_replies}", timeout=60_000
    )


def reply_text(page, i=-1) -> str:
    return page.evaluate(f"[...document.querySelectorAll('.msg.assistant .text')].at({i}).innerText")


def test_a_streamed_reply_renders_as_markdown_with_highlighted_code_and_a_working_copy_button(page, tmp_path):
    assert "qwen2" in page.text_content("#pair")
    page.fill("#prompt", ASK)
    page.press("#prompt", "Enter")
    # Rendered while it streams: a code block is there while the Stop button is still live.
    page.wait_for_function(
        "document.querySelector('.msg.assistant pre.code') && !document.getElementById('stop').disabled", timeout=30_000
    )
    page.wait_for_selector(".msg.assistant .finish", timeout=60_000)
    reply = page.locator(".msg.assistant").last
    assert reply.locator("strong").first.inner_text() == "fixed"
    assert reply.locator("table td").all_inner_texts() == ["1", "2", "3"]
    assert reply.locator("pre.code").count() == 2
    code = reply.locator("pre.code code").first
    assert "hljs" in code.get_attribute("class") and code.locator(".hljs-keyword").first.inner_text() == "def"
    assert reply.locator(".codebar .lang").first.inner_text() == "python"
    text = reply_text(page)
    assert "```" not in text and "**" not in text and "|---" not in text  # no raw Markdown shows
    reply.locator("button.copy").first.click()
    page.wait_for_function("document.querySelector('.msg.assistant button.copy').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == CODE
    # The label goes back after a moment (the next test reads the reply's text, label included).
    page.wait_for_function("document.querySelector('.msg.assistant button.copy').textContent === 'Copy'")
    assert page.is_visible(".msg.assistant .finish") and "finish: stop" in reply.locator(".finish").inner_text()
    assert all(u.startswith(page.url) for u in page.requests), page.requests  # nothing from the network
    shoot(page, "light", tmp_path)


def test_the_overlay_tints_accepted_draft_tokens_without_changing_the_text(page, tmp_path):
    reply = page.locator(".msg.assistant").last
    before = reply_text(page)
    drafted = reply.locator(".tok.d")
    assert drafted.count() > 0 and reply.locator(".tok.t").count() > 0
    assert reply.locator("pre.code .tok.d").count() > 0  # inside the highlighted code too
    plain_bg = drafted.first.evaluate("e => getComputedStyle(e).backgroundColor")
    page.check("#overlay")
    tinted_bg = drafted.first.evaluate("e => getComputedStyle(e).backgroundColor")
    target_bg = reply.locator(".tok.t").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert tinted_bg != plain_bg and target_bg == plain_bg  # only accepted drafts are tinted
    assert reply_text(page) == before
    first = drafted.first
    first.hover()
    pos, rnd = int(first.get_attribute("data-pos")), int(first.get_attribute("data-round"))
    assert pos >= 1 and rnd >= 1
    assert first.get_attribute("title") == f"accepted draft token · draft position {pos} · round {rnd}"
    # The tokens the page marks are the stream's: every draft position it shows is one the server reported.
    flags = page.evaluate("JSON.parse(localStorage.getItem('mlx-spec-chats')).chats[0].messages[1].marks")
    assert sum(1 for _, p, _ in flags if p) == int(page.text_content("#s-counts").split(" / ")[1])
    shoot(page, "overlay", tmp_path)
    page.uncheck("#overlay")
    assert reply_text(page) == before
    assert drafted.first.evaluate("e => getComputedStyle(e).backgroundColor") == plain_bg


def test_a_reload_keeps_the_conversation_and_the_next_turn_reuses_the_cached_prefix(page, server):
    page.reload()
    page.wait_for_function("document.querySelectorAll('.msg').length === 2")
    assert page.locator(".msg.assistant pre.code").count() == 2  # rendered again from the stored reply
    assert page.locator("#chat-list .chat").count() == 1
    assert page.locator("#chat-list .chat.active .open").inner_text().startswith("Fix this function")
    ask(page, "Now write sub.", 2)
    prompt, cached = page.text_content("#s-prompt").rstrip(")").split(" (")
    assert 0 < int(cached) < int(prompt)
    last = health(server)["requests"][-1]
    assert (last["prompt_tokens"], last["prompt_cached"]) == (int(prompt), int(cached))


def test_conversations_can_be_started_renamed_switched_and_deleted(page):
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0 and page.locator("#chat-list .chat").count() == 2
    ask(page, "def add(a, b):", 1)
    chats = page.locator("#chat-list .chat")
    assert chats.first.locator(".open").inner_text() == "def add(a, b):"
    chats.first.locator(".rename").click()
    page.fill(".rename-input", "second chat")
    page.press(".rename-input", "Enter")
    assert chats.first.locator(".open").inner_text() == "second chat"
    chats.nth(1).locator(".open").click()  # back to the first conversation
    page.wait_for_function("document.querySelectorAll('.msg').length === 4")
    page.locator("#chat-list .chat").first.hover()  # its buttons show on hover (or when it is open)
    delete = page.locator("#chat-list .chat").first.locator(".delete")
    delete.click()
    assert page.locator("#chat-list .chat").count() == 2  # one click only arms it
    delete.click()
    assert page.locator("#chat-list .chat").count() == 1
    stored = page.evaluate("JSON.parse(localStorage.getItem('mlx-spec-chats')).chats.map(c => c.title)")
    assert len(stored) == 1 and stored[0].startswith("Fix this function")


def test_the_drafter_and_k_are_shown_and_switched_for_the_next_reply(page, server):
    assert page.input_value("#drafter") == "suffix" and page.text_content("#k") == "K 4"
    options = page.eval_on_selector_all("#drafter option", "os => os.map(o => o.value)")
    assert options[0] == "suffix" and {"none", "ngram", "self"} <= set(options)
    page.click("#new-chat")
    page.select_option("#drafter", "none")
    assert page.text_content("#k") == "plain decoding"
    ask(page, ASK, 1)
    assert page.text_content("#s-counts") == "0 / 0"  # plain decoding: nothing drafted
    assert reply_text(page).startswith("Here is the fixed function")
    page.select_option("#drafter", "suffix")


def test_keys_shift_enter_breaks_the_line_and_escape_stops_the_reply(page):
    page.click("#new-chat")
    page.fill("#prompt", "one")
    page.press("#prompt", "Shift+Enter")
    page.type("#prompt", "two")
    assert page.input_value("#prompt") == "one\ntwo"
    page.fill("#prompt", "")
    page.evaluate("document.getElementById('max-tokens').value = 200")
    page.fill("#prompt", ASK)
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant .tok", timeout=30_000)
    page.keyboard.press("Escape")
    page.wait_for_selector(".msg.assistant .finish", timeout=30_000)
    assert page.locator(".msg.assistant .finish").last.inner_text() == "stopped"
    assert page.is_disabled("#stop") and not page.is_disabled("#send")


def test_dark_mode_follows_the_system_and_the_page_fits_390_px(context, server, tmp_path):
    page = context.new_page()
    page.emulate_media(color_scheme="dark")
    page.goto(server.url)
    page.wait_for_function("document.querySelectorAll('.msg').length > 0")
    page.click("#chat-list .chat:last-child .open")  # the first conversation, two turns long
    page.wait_for_function("document.querySelectorAll('.msg').length === 4")
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert sum(int(c) for c in bg[bg.index("(") + 1 : -1].split(",")[:3]) < 3 * 60, bg
    shoot(page, "dark", tmp_path)
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.is_hidden("#chats") and page.is_visible("#menu") and page.is_visible("#send")
    page.click("#menu")
    assert page.is_visible("#chats")
    page.keyboard.press("Escape")
    assert page.is_hidden("#chats")
    page.emulate_media(color_scheme="light")
    shoot(page, "narrow", tmp_path)
    page.close()


def test_a_full_queue_shows_its_429_line_and_the_message_goes_back_in_the_box(browser, tiny_models):
    with Running(
        build_app(scripted_pair(tiny_models, pause=0.05, draft="none"), max_concurrency=1, max_queue=0, max_tokens=200)
    ) as srv:
        body = {"model": "m", "messages": [{"role": "user", "content": ASK}], "max_tokens": 80}
        busy = threading.Thread(target=lambda: httpx.post(srv.url + "v1/chat/completions", json=body, timeout=60))
        busy.start()
        wait_for(srv, lambda h: h["active"] == 1)
        page = browser.new_page()
        page.goto(srv.url)
        page.fill("#prompt", "hello")
        page.press("#prompt", "Enter")
        line = page.wait_for_selector(".notice.error", timeout=30_000)
        assert "busy (429)" in line.inner_text() and "retry later" in line.inner_text()
        assert page.input_value("#prompt") == "hello" and page.locator(".msg").count() == 0
        busy.join(60)
        page.close()


def test_a_lost_server_shows_a_line_and_the_page_reconnects(browser, tiny_models):
    app = lambda: build_app(scripted_pair(tiny_models, draft="none"), max_concurrency=1, max_tokens=200)  # noqa: E731
    srv = Running(app())
    port = int(srv.url.rstrip("/").rsplit(":", 1)[1])
    page = browser.new_page()
    page.goto(srv.url)
    page.wait_for_function("document.getElementById('drafter').options.length > 0")
    srv.stop()
    page.fill("#prompt", "hello")
    page.press("#prompt", "Enter")
    page.wait_for_function(
        "[...document.querySelectorAll('.notice.error')].some(n => n.textContent.includes('Lost the connection'))",
        timeout=30_000,
    )
    assert page.is_visible("#conn") and page.input_value("#prompt") == "hello"
    srv = Running(app(), port=port)
    try:
        page.wait_for_selector(".notice.info", timeout=30_000)
        assert page.locator(".notice.info").inner_text() == "Reconnected." and page.is_hidden("#conn")
        page.press("#prompt", "Enter")
        page.wait_for_selector(".msg.assistant .finish", timeout=60_000)
    finally:
        page.close()
        srv.stop()
