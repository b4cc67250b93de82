"""The web chat end to end in headless Chromium: type a message, watch tokens stream in both colours and the stats fill."""

import shutil

import pytest

from mlx_spec_apps.server.app import build_app
from mlx_spec_apps.server.main import Running
from mlx_spec_apps.server.pair import Pair

CHROMIUM = shutil.which("chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (setup.sh --dev "
                                                         "installs it where it can: apt-get install chromium)")


@pytest.fixture(scope="module")
def server(tiny_models):
    # The target drafts for itself with a fixed K: drafts are mostly accepted, and each round still ends
    # with a token of the target's own, so both colours surely appear.
    target = str(tiny_models["qwen2"])
    pair = Pair.load(target, target, num_draft=4)
    pair.adaptive = False
    with Running(build_app(pair, max_concurrency=2, max_tokens=60)) as srv:
        yield srv


@pytest.fixture(scope="module")
def page(server):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 720})
        page.goto(server.url)
        yield page
        browser.close()


def green_pixels(page) -> int:
    """Pixels of the chart's bar colour: the acceptance-by-position chart has been drawn."""
    return page.evaluate("""() => {
        const c = document.getElementById('chart'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] === 0x2e && d[i + 1] === 0x9d && d[i + 2] === 0x52) n++;
        return n;
    }""")


def test_a_message_streams_tokens_in_both_colours_and_fills_the_stats(page, tiny_models, tmp_path):
    page.wait_for_function("document.getElementById('pair').textContent.includes('draft')")
    assert "qwen2" in page.text_content("#pair")
    page.fill("#prompt", "def add(a, b):")
    page.press("#prompt", "Enter")
    page.wait_for_selector(".msg.assistant .tok", timeout=30_000)  # tokens arrive while it streams
    page.wait_for_selector(".msg.assistant .finish", timeout=60_000)
    drafted, produced = page.locator(".msg.assistant .tok.draft").count(), page.locator(".msg.assistant .tok.target").count()
    assert drafted > 0 and produced > 0, (drafted, produced)
    assert drafted + produced == int(page.text_content("#s-rounds").split(" / ")[0])  # one span per token
    colours = page.evaluate("""() => ['draft', 'target'].map(k =>
        getComputedStyle(document.querySelector('.msg.assistant .tok.' + k)).backgroundColor)""")
    assert colours[0] != colours[1]
    assert float(page.text_content("#s-tps")) > 0
    assert page.text_content("#s-accept").endswith("%") and float(page.text_content("#s-mean")) > 0
    assert green_pixels(page) > 50
    assert page.is_hidden("#error")
    shot = tmp_path / "web_chat.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_the_second_turn_reuses_the_conversation_cache(page):
    page.fill("#prompt", "Now write sub.")
    page.press("#prompt", "Enter")
    page.wait_for_function("document.querySelectorAll('.msg.assistant .finish').length === 2", timeout=60_000)
    prompt, cached = page.text_content("#s-prompt").rstrip(")").split(" (")
    assert 0 < int(cached) < int(prompt)
