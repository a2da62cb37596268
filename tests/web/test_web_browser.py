"""The web view in a real browser: Chromium (Debian's) driven by Playwright.

Each page is opened with listeners on dialogs, console errors and page errors: a
script that ran (an ``alert`` from hostile content) or a CSP violation fails the
test. Screenshots are kept in ``<scratch base>/artefacts/web/`` (see
``support.browser``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import ARGS, CHROMIUM, artefacts, need_browser
from support.serve_helpers import serve_env
from support.tiers import need
from support.web_store import WebProcess, populated_web

need_browser()
need("web", importlib.util.find_spec("jinja2") is not None,
     "the web extra (jinja2: pip install 'chatstate[web]') is not installed")

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebProcess]:
    base = tmp_path_factory.mktemp("webb")
    with populated_web(base, serve_env(base)) as proc:
        yield proc


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page whose dialogs, console errors and uncaught errors are recorded."""

    def __init__(self, browser: Browser, shots: Path) -> None:
        self.context = browser.new_context(viewport={"width": 1100, "height": 800})
        self.page: Page = self.context.new_page()
        self.shots = shots
        self.dialogs: list[str] = []
        self.errors: list[str] = []

        def on_dialog(dialog: Any) -> None:
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        self.page.on("dialog", on_dialog)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, url: str, shot: str) -> Page:
        self.page.goto(url)
        self.page.wait_for_load_state("load")
        self.page.screenshot(path=str(self.shots / f"{shot}.png"), full_page=True)
        return self.page

    def quiet(self) -> None:
        assert self.dialogs == [], f"a script ran: {self.dialogs}"
        assert self.errors == [], f"console errors: {self.errors}"


@pytest.fixture
def tab(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Watched]:
    watched = Watched(browser, artefacts(request.config, "web"))
    try:
        yield watched
    finally:
        watched.context.close()


def test_list_and_search(web: WebProcess, tab: Watched) -> None:
    page = tab.open(web.url + "/", "list")
    assert page.locator("#conversations tbody tr").count() == 50
    assert page.locator('tr[data-id="rich"] .flag', has_text="interrupted").count() == 1
    page.fill('input[name="q"]', "walruses")
    page.click('button[type="submit"]')
    page.wait_for_load_state("load")
    page.screenshot(path=str(tab.shots / "search.png"))
    assert page.locator("#conversations tbody tr").count() == 1
    assert page.locator('tr[data-id="plain-007"]').count() == 1
    tab.page.click('a[href="/c/plain-007"]')
    page.wait_for_load_state("load")
    assert "walruses" in page.inner_text(".messages")
    tab.quiet()


def test_a_rich_conversation(web: WebProcess, tab: Watched) -> None:
    page = tab.open(web.url + "/c/rich", "conversation")
    image = page.locator("figure.attachment img")
    assert image.count() == 1
    assert page.evaluate("(img) => img.naturalWidth", image.element_handle()) == 64  # loaded
    assert page.locator("pre.hl .hl-k", has_text="def").count() == 1
    assert page.locator("a[download]", has_text="report.pdf").count() == 1
    call = page.locator("details.call", has_text="send_email")
    assert not call.locator("pre").first.is_visible()  # folded
    call.locator("summary").click()
    assert call.locator("pre").first.is_visible()
    assert "outcome unknown" in call.inner_text()
    assert "partial: cut off" in page.inner_text("#mpartial")
    assert page.get_attribute("#verdict", "data-ok") == "true"
    page.screenshot(path=str(tab.shots / "conversation-open-call.png"), full_page=True)
    tab.quiet()


def test_the_badge_on_a_damaged_conversation(web: WebProcess, tab: Watched) -> None:
    page = tab.open(web.url + "/c/damaged", "damaged")
    assert page.get_attribute("#verdict", "data-ok") == "false"
    assert "hash chain broken at seq 2" in page.inner_text("#verdict")
    page = tab.open(web.url + "/c/badblob", "damaged-blob")
    assert page.get_attribute("#verdict", "data-ok") == "false"
    assert "altered" in page.inner_text("#verdict")
    tab.quiet()


def test_the_usage_chart(web: WebProcess, tab: Watched) -> None:
    page = tab.open(web.url + "/usage", "usage")
    bars = page.locator("svg.chart g.bar")
    assert bars.count() >= 5
    box = page.locator("svg.chart").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100
    assert page.locator("#by-model td", has_text="model-a").count() == 1
    tab.quiet()


def test_hostile_content_runs_nothing(web: WebProcess, tab: Watched) -> None:
    page = tab.open(web.url + "/c/hostile", "hostile")
    assert "<script>" in page.inner_text(".messages")  # shown as text
    assert page.locator(".messages script, .messages iframe, .messages img").count() == 0
    for link in page.locator(".messages a").all():
        href = link.get_attribute("href") or ""
        assert not href.lower().startswith(("javascript:", "data:")), href
    # the SVG with script: a download, and opened directly it is sandboxed: nothing runs
    for href in [a.get_attribute("href") for a in page.locator(".attachment a").all()]:
        response = tab.page.request.get(web.url + str(href))
        assert response.headers["content-disposition"].startswith("attachment")
    with tab.page.expect_download():
        page.locator(".attachment a").first.click()
    tab.quiet()
