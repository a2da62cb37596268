"""The web view over real HTTP: ``chatstate web`` as a process on loopback, and serve's /ui.

The pages (list, search, filters, a rich conversation, the verdict, exports, usage),
and the guarantees of docs/web.md: read-only (every other method 405), the Host
check, the CSP on every response, blobs typed and downloaded, hostile content inert,
and a token seeing only its own conversations under serve.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from support.cli_helpers import run_cli
from support.serve_helpers import ServeProcess, local_url, serve_env
from support.tiers import need
from support.web_store import SVG, WebProcess, populated_web, store_url

from chatstate.ops.usage import collect
from chatstate.stores import open_store
from chatstate.testing import FakeModel

need("web", importlib.util.find_spec("jinja2") is not None,
     "the web extra (jinja2: pip install 'chatstate[web]') is not installed")


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebProcess]:
    base = tmp_path_factory.mktemp("web")
    with populated_web(base, serve_env(base)) as proc:
        yield proc


def get(web: WebProcess, path: str, **headers: str) -> httpx2.Response:
    return httpx2.get(web.url + path, headers=headers, timeout=30)


def rows(page: str) -> list[str]:
    return re.findall(r'<tr data-id="([^"]+)">', page)


def test_the_list_pages_and_flags(web: WebProcess) -> None:
    first = get(web, "/")
    assert first.status_code == 200
    ids = rows(first.text)
    assert len(ids) == 50 and 'rel="next"' in first.text
    second = rows(get(web, "/?page=2").text)
    assert not set(ids) & set(second)
    everything = set(ids) | set(second)
    assert {"rich", "hostile", "events", "damaged", "badblob", web.facts["fork"],
            "plain-000", "plain-059"} <= everything
    listed = first.text + get(web, "/?page=2").text
    rich = re.search(r'<tr data-id="rich">.*?</tr>', listed, re.S)
    assert rich is not None
    assert "interrupted" in rich.group() and "cut" not in rich.group()
    cut = re.search(r'<tr data-id="plain-003">.*?</tr>', listed, re.S)
    assert cut is not None and ">cut<" in cut.group() and "interrupted" not in cut.group()
    assert "model-a" in rich.group() and "320 / 52" in rich.group()
    fork = re.search(rf'<tr data-id="{web.facts["fork"]}">.*?</tr>', listed, re.S)
    assert fork is not None and "forked" in fork.group()
    damaged = re.search(r'<tr data-id="damaged">.*?</tr>', listed, re.S)
    assert damaged is not None and "damaged" in damaged.group()


def test_search_and_filters(web: WebProcess) -> None:
    assert rows(get(web, "/?q=walruses").text) == ["plain-007"]
    assert rows(get(web, "/?q=no-such-words-anywhere").text) == []
    by_model = rows(get(web, "/?model=model-b").text)
    assert "hostile" in by_model and "rich" not in by_model
    assert all(not r.startswith("plain-") or int(r[6:]) % 2 == 0 for r in by_model)
    dated = rows(get(web, "/?until=2026-10-03").text)
    assert dated and all(r.startswith("plain-") for r in dated)
    assert get(web, "/?since=yesterday").status_code == 400


def test_a_rich_conversation(web: WebProcess) -> None:
    page = get(web, "/c/rich").text
    assert '<span class="hl-k">def</span>' in page  # highlighted code
    assert "<strong>bold</strong>" in page
    image = re.search(r'<img src="(/c/rich/part/0/1)"', page)
    assert image is not None
    shown = get(web, image.group(1))
    assert shown.headers["content-type"] == "image/png"
    assert shown.headers["content-disposition"] == "inline"
    pdf = get(web, "/c/rich/part/0/2")
    assert pdf.headers["content-disposition"].startswith("attachment")
    assert pdf.content == b"%PDF-1.4 fake"
    assert "get_weather" in page and "rain, 4 C" in page
    assert "outcome unknown: interrupted, it may or may not have run" in page
    assert "started: it may have run; no result was stored" in page  # the tool loop's marker
    assert 'id="mpartial"' in page and "partial: cut off" in page and "Once upon a time" in page
    assert "temperature" in page and "1.50 s" in page  # the request record
    assert '<p class="badge ok" id="verdict"' in page
    assert "Interrupted: the reply to turn r3 was cut off after 16 characters" in page
    assert "Cut short: the reply was cut at the token limit" in get(web, "/c/plain-003").text
    assert web.facts["fork"] in page  # its child
    child = get(web, f"/c/{web.facts['fork']}").text
    assert 'id="parent" href="/c/rich"' in child


def test_events_are_shown(web: WebProcess) -> None:
    page = get(web, "/c/events").text
    assert "pop: hides message seq 1" in page and "hidden by event seq 2" in page


def test_the_verdict_names_the_first_break(web: WebProcess) -> None:
    damaged = get(web, "/c/damaged")
    assert damaged.status_code == 200
    assert 'data-ok="false"' in damaged.text and "hash chain broken at seq 2" in damaged.text
    blob = get(web, "/c/badblob").text
    assert 'data-ok="false"' in blob and web.facts["badblob_sha"] in blob
    assert "altered" in blob


def test_every_export_format_downloads(web: WebProcess) -> None:
    for fmt in ("chatstate", "openai", "jsonl", "markdown", "text"):
        r = get(web, f"/c/rich/export/{fmt}")
        assert r.status_code == 200, fmt
        assert r.headers["content-disposition"].startswith('attachment; filename="rich.')
    doc = json.loads(get(web, "/c/rich/export/chatstate").text)
    assert len(doc["messages"]) == 8 and doc["partial"]["content"] == "Once upon a time"
    assert get(web, "/c/rich/export/pickle").status_code == 404


def test_usage_matches_the_usage_command(web: WebProcess) -> None:
    page = get(web, "/usage").text
    store = open_store(web.store_url)
    try:
        by_day = collect(store, by="day")
    finally:
        store.close()
    assert "<svg" in page and page.count('<g class="bar"') == len(by_day.rows)
    for row in by_day.rows:
        assert f'data-day="{row.key}"' in page
    assert "model-a" in page and "model-b" in page


def test_only_get_and_head(web: WebProcess) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        for path in ("/", "/c/rich", "/nowhere"):
            r = httpx2.request(method, web.url + path, timeout=10)
            assert r.status_code == 405, (method, path)
            assert r.headers["allow"] == "GET, HEAD"
    assert httpx2.head(web.url + "/c/rich", timeout=10).status_code == 200


def test_host_check_and_headers(web: WebProcess) -> None:
    assert get(web, "/", Host="attacker.example").status_code == 421
    assert get(web, "/", Host="localhost").status_code == 200
    for path in ("/", "/c/rich", "/usage", "/c/nowhere", "/static/web.css"):
        r = get(web, path)
        csp = r.headers["content-security-policy"]
        assert "script-src 'none'" in csp and "default-src 'self'" in csp, path
        assert r.headers["x-content-type-options"] == "nosniff"


def test_hostile_content_is_inert(web: WebProcess) -> None:
    page = get(web, "/c/hostile").text
    body = page.split("<main>", 1)[1]
    assert "<script" not in body and "<iframe" not in body and "<img src=x" not in body
    assert not re.search(r'(href|src)="\s*(javascript|data|vbscript):', body, re.I)
    assert "&lt;script&gt;" in body  # shown, as text
    assert "<code>javascript:alert(&#39;part&#39;)</code>" in body  # an image URL: named
    listed = get(web, "/").text
    assert "<script" not in listed.split("<main>", 1)[1] and "&lt;script&gt;" in listed
    svgs = re.findall(r'href="(/c/hostile/(?:blob|part)/[^"]+)"', body)
    assert len(svgs) == 2  # the blob and the inline data URL: downloads, never <img>
    for href in svgs:
        r = get(web, href)
        assert r.content == SVG
        assert r.headers["content-disposition"].startswith("attachment")
        assert r.headers["content-security-policy"].startswith("sandbox")


def test_serve_ui_shows_a_token_only_its_own(tmp_path: Path) -> None:
    with FakeModel(reply_words=3) as fake, ServeProcess(
            local_url("sqlite", tmp_path), fake.base_url, serve_env(tmp_path),
            "--token", "tok-a", "--token", "tok-b") as proxy:
        ids = {}
        for token in ("tok-a", "tok-b"):
            r = httpx2.post(proxy.base_url + "/chat/completions", timeout=30,
                            headers={"Authorization": f"Bearer {token}"},
                            json={"model": f"model-of-{token}", "messages": [
                                {"role": "user", "content": f"hello from {token}"}]})
            assert r.status_code == 200
            ids[token] = r.headers["x-chatstate-conversation"]
        ui = proxy.root + "/ui"
        assert httpx2.get(ui + "/", timeout=10).status_code == 401
        assert "Basic" in httpx2.get(ui + "/", timeout=10).headers["www-authenticate"]
        page = httpx2.get(ui + "/", headers={"Authorization": "Bearer tok-a"}, timeout=10)
        assert rows(page.text) == [ids["tok-a"]]
        # nor the models another token's conversations used (the model filter listed them)
        assert "model-of-tok-a" in page.text and "model-of-tok-b" not in page.text
        assert f'href="/ui/c/{ids["tok-a"]}"' in page.text  # links follow the mount
        basic = base64.b64encode(b":tok-b").decode()
        page = httpx2.get(ui + "/", headers={"Authorization": f"Basic {basic}"}, timeout=10)
        assert rows(page.text) == [ids["tok-b"]]
        other = httpx2.get(f"{ui}/c/{ids['tok-a']}", timeout=10,
                           headers={"Authorization": f"Basic {basic}"})
        assert other.status_code == 404
        mine = httpx2.get(f"{ui}/c/{ids['tok-b']}", timeout=10,
                          headers={"Authorization": f"Basic {basic}"})
        assert mine.status_code == 200 and "hello from tok-b" in mine.text
        usage = httpx2.get(ui + "/usage", headers={"Authorization": "Bearer tok-a"},
                           timeout=10).text
        assert usage.count('<g class="bar"') == 1
        assert httpx2.get(ui + "/", headers={"Authorization": "Bearer tok-a",
                                             "Host": "attacker.example"},
                          timeout=10).status_code == 421
        r = httpx2.delete(f"{ui}/c/{ids['tok-a']}", timeout=10,
                          headers={"Authorization": "Bearer tok-a"})
        assert r.status_code == 405


def test_web_refuses_a_non_loopback_address(tmp_path: Path) -> None:
    result = run_cli(["web", "--host", "0.0.0.0", "--port", "0"], serve_env(tmp_path),
                     store=store_url(tmp_path))
    assert result.code == 2
    assert "no login" in result.err and "/ui" in result.err


def test_a_store_without_search_says_so(tmp_path: Path) -> None:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    store.close()
    proc = WebProcess(url, serve_env(tmp_path))
    try:
        page = get(proc, "/")
        assert page.status_code == 200
        assert 'name="q"' not in page.text and "no full-text search" in page.text
        refused = get(proc, "/?q=anything")
        assert refused.status_code == 400 and "sqlite or postgresql" in refused.text
    finally:
        proc.stop()


@pytest.mark.parametrize("error", [{"status": "<script>alert(1)</script>"}, {}, "a string"])
def test_an_upstream_error_note_of_another_shape_is_shown_not_a_500(
        tmp_path: Path, error: object) -> None:
    # metadata is outside the chain (an import, an older writer): a note without turn_id
    # made the whole page a 500
    from chatstate.core.transcript import Conversation, Message

    url = f"json://{tmp_path}/store"
    store = open_store(url)
    store.create(Conversation(id="odd", metadata={"last_upstream_error": error}))
    store.append("odd", [Message.seal(None, role="user", content="hi", turn_id="t1")])
    store.close()
    proc = WebProcess(url, serve_env(tmp_path))
    try:
        page = get(proc, "/c/odd")
        assert page.status_code == 200, page.text
        assert "<script>alert(1)" not in page.text
        assert ('id="upstream-error"' in page.text) is isinstance(error, dict)
    finally:
        proc.stop()


def test_an_encrypted_store_flags_every_row(tmp_path: Path) -> None:
    """The encrypted flag: a store opened with its key seals every record, so every row
    of its list says so; a plain store's rows never do."""
    from support.cli_helpers import cli_env, invoke
    from support.sealed import KEY

    store = f"sqlite://{tmp_path}/sealed.db"
    env = {**cli_env(tmp_path), "CHATSTATE_ENCRYPTION_KEY": KEY}
    assert invoke(["ask", "--model", "fake", "--id", "secret", "hello"], store=store,
                  env=env).code == 0
    sealed = WebProcess(store, env)
    try:
        row = re.search(r'<tr data-id="secret">.*?</tr>', get(sealed, "/").text, re.S)
        assert row is not None and ">encrypted<" in row.group()
    finally:
        sealed.stop()


def test_a_plain_store_has_no_encrypted_flag(web: WebProcess) -> None:
    assert ">encrypted<" not in get(web, "/").text
