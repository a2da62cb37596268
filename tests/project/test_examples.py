"""The examples the README and docs/ quote run, and leave the transcripts they claim.

Two parts: the scripts in examples/ (run whole, their transcripts checked), and every
code block of README.md and docs/*.md (run in order, page by page; see below)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ROOT

import chatstate
from chatstate import Conversation, open_store
from chatstate.testing import FakeModel

EXAMPLES = ROOT / "examples"


def run(script: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd,
                            env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


def conversations(url: str) -> list[Conversation]:
    store = open_store(url)
    try:
        convs = [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()
    for conv in convs:
        assert conv.verify() is None
    return convs


def shape(conv: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.status) for m in conv.messages]


TURN = [("user", "complete"), ("assistant", "complete")]


def test_quickstart(local_store_url: str, tmp_path: Path) -> None:
    out = run("quickstart.py", local_store_url, cwd=tmp_path).stdout
    assert f"store {local_store_url}: durable" in out
    assert "assistant> Echo: What does chatstate promise?" in out
    assert "4 messages, hash chain intact" in out
    (conv,) = conversations(local_store_url)
    assert shape(conv) == TURN * 2
    assert f"conversation {conv.id}:" in out
    for message in conv.messages:  # the replay printed what the store holds
        assert f"[{message.seq}] {message.role}: {message.content}" in out


def test_quickstart_uses_the_configured_endpoint_and_store(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/env.db"
    with FakeModel() as model:
        out = run("quickstart.py", cwd=tmp_path, CHATSTATE_STORE=url,
                  CHATSTATE_BASE_URL=model.base_url).stdout
        requests = [e for e in model.request_log if e["path"] == "/v1/chat/completions"]
    assert [r["stream"] for r in requests] == [False, True]
    (conv,) = conversations(url)
    assert conv.messages[-1].content in out


def test_resume_interrupted(local_store_url: str, tmp_path: Path) -> None:
    out = run("resume_interrupted.py", local_store_url, cwd=tmp_path).stdout
    assert "failed: model request" in out
    assert "cut off after" in out
    assert "(kept as partial)" in out
    (conv,) = conversations(local_store_url)
    user, partial, reply = conv.messages
    assert shape(conv) == [("user", "complete"), ("assistant", "partial"),
                           ("assistant", "complete")]
    assert user.turn_id == partial.turn_id == reply.turn_id
    assert reply.content.startswith(partial.content)
    assert f"retried> {reply.content}" in out


def test_async_chat(local_store_url: str, tmp_path: Path) -> None:
    out = run("async_chat.py", local_store_url, cwd=tmp_path).stdout
    convs = conversations(local_store_url)
    assert len(convs) == 2
    for conv in convs:
        assert shape(conv) == TURN * 2
        assert f"{conv.id}: 4 messages, last reply {conv.messages[-1].content!r}" in out


def test_agents_session(local_store_url: str, tmp_path: Path) -> None:
    pytest.importorskip("agents", reason="the Agents SDK is not installed (chatstate[agents])")
    out = run("agents_session.py", local_store_url, cwd=tmp_path).stdout
    assert "assistant> Tool results:" in out
    assert "sunny in Paris" in out
    assert "assistant> Echo: Thanks! What did I ask?" in out
    (conv,) = conversations(local_store_url)
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant",
                                               "user", "assistant"]
    assert f"session agents-demo: {len(conv.messages)} messages, hash chain intact" in out


def test_langchain_history(local_store_url: str, tmp_path: Path) -> None:
    pytest.importorskip("langchain_core", reason="langchain-core is not installed "
                        "(chatstate[langchain])")
    out = run("langchain_history.py", local_store_url, cwd=tmp_path).stdout
    assert "tool call: weather {'city': 'Paris'}" in out
    assert "assistant> You asked about Paris." in out
    (conv,) = conversations(local_store_url)
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant",
                                               "user", "assistant"]
    assert conv.messages[1].tool_calls is not None
    assert conv.messages[2].tool_call_id
    assert "conversation langchain-demo: 6 messages, hash chain intact" in out


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_is_short_and_documented(script: str) -> None:
    text = (EXAMPLES / script).read_text()
    assert text.startswith('"""')
    assert f"python examples/{script}" in text
    assert len(text.splitlines()) <= 60, "examples are quoted in docs/: keep them short"


def test_vision(local_store_url: str, tmp_path: Path) -> None:
    out = run("vision.py", local_store_url, cwd=tmp_path).stdout
    assert "assistant> Echo: What is in this picture? [image/png " in out
    (conv,) = conversations(local_store_url)
    assert shape(conv) == TURN * 2
    ref = conv.messages[0].blob_refs()[0]
    assert ref["name"] == "noise.png"
    assert ref["size"] > 64 * 1024
    for number in (1, 2):  # both requests carried the image, whole
        assert (f"request {number}: the model got image/png, {ref['size']} bytes, "
                f"sha256 {ref['sha256'][:12]}…") in out
    assert f"[image: noise.png, {ref['size'] / 1024:.1f} KiB, sha256 {ref['sha256']}]" in out
    assert "4 messages, hash chain intact: True, 1 blob stored once, digest checked" in out


def test_tools(local_store_url: str, tmp_path: Path) -> None:
    out = run("tools.py", local_store_url, cwd=tmp_path).stdout
    assert "  tool call   get_weather(" in out
    assert "  tool call   send_email(" in out
    assert "(interrupted while send_email ran)" in out
    assert "send_email (call_" in out
    assert ", started)" in out
    assert "12 messages, chain intact: True" in out
    (conv,) = conversations(local_store_url)
    tools = [("tool", "complete"), ("tool", "partial")]  # a result; send_email's marker
    assert shape(conv) == [("user", "complete"), ("assistant", "complete"), *tools,
                           ("tool", "complete"), ("assistant", "complete"),
                           ("user", "complete"), ("assistant", "complete"), *tools,
                           ("tool", "unknown"), ("assistant", "complete")]
    assert conv.messages[-1].content.endswith("may or may not have run; it was not run again")


def test_the_tools_page_example_runs(local_store_url: str, tmp_path: Path) -> None:
    """docs/tools.md's first Python block, run as it is written."""
    page = (EXAMPLES.parent / "docs" / "tools.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "page_example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={
                                **{k: v for k, v in os.environ.items()
                                   if not k.startswith(("CHATSTATE_", "OPENAI_"))},
                                "CHATSTATE_STORE": local_store_url})
    assert result.returncode == 0, result.stderr
    assert "tool call> get_weather" in result.stdout
    assert "assistant> Tool results: call_" in result.stdout
    (conv,) = conversations(local_store_url)
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]


# -- the pages: README.md and every docs/*.md, code blocks run as a reader would ----------
#
# Discovered, not listed: a page added to docs/ later is covered without touching this file.
# ``python`` blocks run as scripts, ``sh`` blocks as one bash script, ``console`` blocks
# command by command (``$ `` lines; the lines after one are its sample output, and the
# first word of each sample line must appear in what the command really printed). A
# command ending in ``# exit N`` must exit N, any other 0. All blocks of a page share one
# scratch directory and HOME (so the default store is fresh) and, as CHATSTATE_BASE_URL,
# a fake model server, so a block that talks to "gpt-4o-mini" runs offline. The scratch
# directory stands in for the checkout's root: `examples/` and `.venv/` are linked into it,
# so `.venv/bin/python examples/X.py` runs as the pages say. A block that
# cannot run here is preceded by ``<!-- not run: REASON -->``, and the reason is required.
# Blocks in any other language (``text``, none) are sample output and are not run, so
# they must not hold ``$ `` commands.

ROOT = EXAMPLES.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = ("python", "sh", "console")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.*?)\s*-->$")
EXIT = re.compile(r"#\s*exit\s+(?P<code>\d+)\b[^#]*$")


@dataclass
class Block:
    page: Path
    line: int          # 1-based line of the opening fence
    lang: str
    text: str
    not_run: str | None  # the reason given, when marked

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def fences(lines: list[str]) -> list[tuple[int, int, str]]:
    """CommonMark fenced blocks as (opening line, closing line, language), 0-based.

    A fence is three or more backticks or tildes; it is closed by a fence of the same
    character, at least as long, with nothing after it, so a ~~~~ block may hold ```
    lines. An unclosed fence runs to the end of the page (the closing line is then
    len(lines))."""
    found: list[tuple[int, int, str]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m.group("fence")[0] == "`" and "`" in m.group("info")):
            i += 1
            continue
        fence = m.group("fence")
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
        info = m.group("info").strip()
        found.append((i, end, info.split()[0] if info else ""))
        i = end + 1
    return found


def code_blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    for start, end, lang in fences(lines):
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marked = NOT_RUN.match(before)
        found.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:end]),
                           marked.group("reason") if marked else None))
    return found


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines (``\\`` continues one) with the sample output that follows."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + next(lines).strip()
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise AssertionError(f"console block starts with output, not a `$ ` command: {line!r}")
    return steps


def page_env(home: Path, base_url: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("CHATSTATE_", "OPENAI_", "AWS_", "XDG_"))}
    bindir = str(Path(sys.executable).parent)  # this venv's `chatstate`, not another one
    return {**clean, "HOME": str(home), "PATH": f"{bindir}:{clean.get('PATH', '')}",
            "CHATSTATE_BASE_URL": base_url, "CHATSTATE_API_KEY": "sk-docs-not-a-real-key",
            "AWS_EC2_METADATA_DISABLED": "true", "NO_COLOR": "1", "COLUMNS": "120"}


def shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def first_words(sample: list[str]) -> list[str]:
    """The first word of each sample line, except elided (…) or placeholder ones, and a
    table's border lines (drawn to the width of what the table holds)."""
    words = [line.split()[0] for line in sample if line.strip()]
    return [w for w in words if "…" not in w and not w.startswith("<")
            and not all("\u2500" <= c <= "\u257f" for c in w)]


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.lang == "python":
        script = cwd / f"block_{block.line}.py"
        script.write_text(block.text + "\n")
        result = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"{block.where}: python block failed\n{result.stderr}"
        return
    if block.lang == "sh":
        result = shell(block.text, cwd, env)
        assert result.returncode == 0, f"{block.where}: sh block failed\n{result.stderr}"
        return
    for command, sample in console_steps(block.text):
        result = shell(command, cwd, env)
        expected = int(m.group("code")) if (m := EXIT.search(command)) else 0
        said = result.stdout + result.stderr
        assert result.returncode == expected, (
            f"{block.where}: `{command}` exited {result.returncode}, the page says {expected}\n"
            f"{said}")
        missing = [w for w in first_words(sample) if w not in said]
        assert not missing, (f"{block.where}: `{command}` printed none of {missing}, which the "
                             f"page shows it printing:\n{said}")


def test_fences_follow_commonmark(tmp_path: Path) -> None:
    """A ~~~~ or ```` block may show ``` lines; only its own kind and length closes it."""
    page = tmp_path / "page.md"
    page.write_text("~~~~console\n$ cat a.md\n```python\nx = 1\n```\n~~~~\n\n"
                    "````\n```\n````\n\n```sh\necho ~~~\n```\n# After\n"
                    "```text\nunclosed\n# Not a heading\n")
    assert [(b.line, b.lang, b.text) for b in code_blocks(page)] == [
        (1, "console", "$ cat a.md\n```python\nx = 1\n```"),
        (8, "", "```"),
        (12, "sh", "echo ~~~"),
        (16, "text", "unclosed\n# Not a heading")]
    assert anchors(page) == {"after"}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_code_block_on_the_page_runs(page: Path, tmp_path: Path) -> None:
    blocks = code_blocks(page)
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "examples").symlink_to(EXAMPLES)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # this venv, as `make setup` builds it
    ran = 0
    with FakeModel() as model:
        env = page_env(home, model.base_url)
        for block in blocks:
            if block.lang in RUNNABLE and block.not_run is None:
                run_block(block, tmp_path, env)
                ran += 1
    runnable = [b for b in blocks if b.lang in RUNNABLE]
    assert ran == len([b for b in runnable if b.not_run is None])


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_blocks_are_labelled_and_unrun_ones_say_why(page: Path) -> None:
    for block in code_blocks(page):
        if block.not_run is not None:
            assert block.lang in RUNNABLE, f"{block.where}: only runnable blocks need `not run`"
            assert len(block.not_run.split()) >= 3, f"{block.where}: say why it is not run"
        if block.lang not in RUNNABLE:
            commands = [ln for ln in block.text.splitlines() if ln.startswith("$ ")]
            assert not commands, (f"{block.where}: a ```{block.lang} block holds commands "
                                  f"({commands[0]!r}): label it ```console so it runs, or mark "
                                  "it <!-- not run: REASON -->")


LINK = re.compile(r"\]\((?P<target>[^)#\s]*)(?:#(?P<anchor>[^)\s]*))?\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    lines = page.read_text().splitlines()
    fenced = {j for start, end, _ in fences(lines) for j in range(start, end + 1)}
    found = set()
    for i, line in enumerate(lines):
        if i not in fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    broken = []
    for m in LINK.finditer(page.read_text()):
        target, anchor = m.group("target"), m.group("anchor")
        if "://" in target:
            continue
        path = page.parent / target if target else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(m.group(0))
    assert not broken, f"{page.relative_to(ROOT)} links to missing files or headings: {broken}"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    readme, index = (ROOT / "README.md").read_text(), (ROOT / "docs" / "README.md").read_text()
    assert "(docs/README.md)" in readme
    for page in PAGES[1:]:
        if page.name != "README.md":
            assert f"({page.name})" in index, f"docs/README.md does not link {page.name}"


def test_the_library_page_names_every_public_name() -> None:
    text = (ROOT / "docs" / "library.md").read_text()
    missing = [name for name in chatstate.__all__ if f"`{name}" not in text]
    assert not missing, f"docs/library.md does not document {missing}"


def test_the_readme_stays_one_screen_of_essentials() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme
    assert "make test" in readme
