"""`ask -a`, `chat -a` and the REPL's `/attach`: images and files from the command line.

Proves: an attached image reaches the model inlined (the fake echoes its media type
and size), is stored once in the blob area and shows in replay; a bad path is a
usage error before anything is stored; /attach goes with the next message only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from support.cli_helpers import invoke, replay_json

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 400  # 102,408 bytes: above the threshold


def _png(tmp_path: Path) -> Path:
    path = tmp_path / "chart.png"
    path.write_bytes(PNG)
    return path


def test_ask_attaches_an_image_stored_once(tmp_path: Path) -> None:
    s = f"json://{tmp_path}/s"
    png = _png(tmp_path)
    for prompt in ("what is this?", "and again?"):
        result = invoke(["ask", prompt, "-a", str(png), "--model", "fake", "--id", "v"],
                        store=s)
        assert result.code == 0, result.err
        assert f"Echo: {prompt} [image/png {len(PNG)} bytes]" in result.out
    messages = replay_json(s, "v")["messages"]
    ref = messages[0]["content"][1]["blob"]
    assert ref == {"sha256": hashlib.sha256(PNG).hexdigest(), "size": len(PNG),
                   "media_type": "image/png", "name": "chart.png"}
    assert messages[2]["content"][1]["blob"] == ref
    assert [p.name for p in (tmp_path / "s" / "blobs").iterdir()] == [ref["sha256"]]
    replay = invoke(["replay", "v"], store=s)
    assert f"[0] user: what is this? [image: chart.png, 100 KiB, sha256 {ref['sha256']}]" \
        in replay.out.splitlines()


def test_ask_attaches_a_url_a_text_file_as_text_and_a_binary_file(tmp_path: Path) -> None:
    s = f"json://{tmp_path}/s"
    notes = tmp_path / "notes.txt"
    notes.write_text("hello file\n")
    data = tmp_path / "data.bin"
    data.write_bytes(b"\x00\x01binary")
    result = invoke(["ask", "read", "-a", "https://example.invalid/cat.jpg", "--attach",
                     str(notes), "-a", str(data), "--model", "fake", "--id", "u"], store=s)
    assert result.code == 0, result.err
    assert ('Echo: read [https://example.invalid/cat.jpg] <file name="notes.txt">\nhello file\n'
            '</file> [application/octet-stream 8 bytes]') in result.out
    parts = replay_json(s, "u")["messages"][0]["content"]
    assert parts[1] == {"type": "image_url", "image_url": {"url": "https://example.invalid/"
                                                                  "cat.jpg"}}
    assert parts[2] == {"type": "text", "text": '<file name="notes.txt">\nhello file\n</file>'}
    assert parts[3]["file"]["filename"] == "data.bin"
    assert "blob" not in parts[3]


def test_a_bad_attachment_stores_nothing(tmp_path: Path) -> None:
    s = f"json://{tmp_path}/s"
    missing = tmp_path / "nope.png"
    result = invoke(["ask", "hi", "-a", str(missing), "--model", "fake", "--id", "x"], store=s)
    assert result.code == 2
    assert str(missing) in result.err
    assert invoke(["list", "--json"], store=s).json() == []
    retry = invoke(["ask", "--retry", "--id", "x", "-a", str(missing)], store=s)
    assert retry.code == 2
    assert "takes no --attach" in retry.err


def test_repl_attach_goes_with_the_next_message_only(tmp_path: Path) -> None:
    s = f"json://{tmp_path}/s"
    png = _png(tmp_path)
    result = invoke(["chat", "--model", "fake", "--id", "r"], store=s,
                    input=f"/attach {png}\nlook\nplain now\n/attach {tmp_path}/gone.png\n")
    assert result.code == 1, result.err  # scripted input with a failed line fails the command
    assert "attached [image: chart.png, 100 KiB, inline]" in result.err
    assert f"assistant> Echo: look [image/png {len(PNG)} bytes]" in result.out
    assert "assistant> Echo: plain now " in result.out
    assert "error: cannot attach" in result.err
    assert "gone.png" in result.err
    messages = replay_json(s, "r")["messages"]
    assert messages[0]["content"][0] == {"type": "text", "text": "look"}
    assert messages[2]["content"] == "plain now"
    first = invoke(["chat", "--model", "fake", "--id", "r2", "-a", str(png)], store=s,
                   input="hi\n")
    assert first.code == 0
    assert f"Echo: hi [image/png {len(PNG)} bytes]" in first.out
