"""`replay` marks what a reader must know: a summary standing in for older turns, a reply
cut at its token limit, an interrupted turn."""

from __future__ import annotations

from pathlib import Path

from support.cli_helpers import cli_env, invoke


def test_replay_marks_a_cut_reply_and_a_summary(tmp_path: Path) -> None:
    store = f"json://{tmp_path}/s"
    env = cli_env(tmp_path)
    for text in ("first question", "second question"):
        done = invoke(["ask", "--model", "fake", "--id", "k", text], store=store, env=env)
        assert done.code == 0, done.err
    cut = invoke(["ask", "--model", "fake", "--id", "k", "--max-tokens", "2", "third"],
                 store=store, env=env)
    assert cut.code == 0, cut.err
    squeezed = invoke(["compact", "k", "--model", "fake", "--keep", "1"], store=store, env=env)
    assert squeezed.code == 0, squeezed.err
    shown = invoke(["replay", "k", "--raw"], store=store, env=env)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    [cut_line] = [line for line in lines if line.startswith("[5] assistant")]
    assert "(cut: the reply hit its token limit)" in cut_line
    [summary] = [line for line in lines if "(summary of seq 0-" in line]
    assert summary.startswith("[6] system (summary of seq 0-"), summary
    # a complete reply that ended normally carries no mark
    [plain] = [line for line in lines if line.startswith("[1] assistant")]
    assert "(" not in plain.split(":", 1)[0]
