"""Clients we did not write, pointed at ``chatstate serve``, each in a venv of its own:
llm (through extra-openai-models.yaml) and LangChain's ChatOpenAI (langchain-openai).

The openai SDK and curl are in test_serve.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.serve_helpers import ServeProcess, serve_env
from support.venvs import cached_venv

from chatstate.stores import open_store
from chatstate.testing import FakeModel

LLM = ["llm==0.36"]


@pytest.mark.slow
def test_llm_through_extra_openai_models(tmp_path: Path) -> None:
    bin_dir = cached_venv("llm", LLM, tier="llm client")
    url = f"sqlite://{tmp_path}/s.db"
    with FakeModel(reply_words=5) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path)) as proxy:
        user_path = tmp_path / "llm-config"
        user_path.mkdir()
        (user_path / "extra-openai-models.yaml").write_text(
            f"- model_id: chatstate-proxy\n  model_name: fake-model\n"
            f"  api_base: \"{proxy.base_url}\"\n")
        env = {**serve_env(tmp_path), "LLM_USER_PATH": str(user_path),
               "OPENAI_API_KEY": "not-used-by-the-proxy"}
        outputs = []
        for extra in ([], ["--no-stream"]):
            proc = subprocess.run([str(bin_dir / "llm"), "-m", "chatstate-proxy", *extra,
                                   "hello from llm"], env=env, capture_output=True, text=True,
                                  timeout=120, check=False)
            assert proc.returncode == 0, proc.stderr
            outputs.append(proc.stdout.strip())
        assert fake.request_log[0]["stream"] is True
        assert fake.request_log[1]["stream"] is False
    store = open_store(url)
    try:
        convs = [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()
    replies = sorted(c.messages[-1].text for c in convs)
    assert replies == sorted(outputs)
    assert all(r.startswith("Echo: hello from llm") for r in replies)


LANGCHAIN = ["langchain-openai==1.7.4"]
LANGCHAIN_SCRIPT = """
import sys
from langchain_openai import ChatOpenAI
chat = ChatOpenAI(base_url=sys.argv[1], api_key="unused", model="fake-model", max_retries=0)
print(chat.invoke("hello from langchain").content)
print("".join(str(c.content) for c in chat.stream("stream from langchain")))
"""


@pytest.mark.slow
def test_langchain_chat_openai(tmp_path: Path) -> None:
    bin_dir = cached_venv("langchain-openai", LANGCHAIN, tier="LangChain client")
    url = f"json://{tmp_path}/store"
    with FakeModel(reply_words=5) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path)) as proxy:
        proc = subprocess.run([str(bin_dir / "python"), "-c", LANGCHAIN_SCRIPT, proxy.base_url],
                              env=serve_env(tmp_path), capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert [e["stream"] for e in fake.request_log] == [False, True]
    plain, streamed = proc.stdout.strip().splitlines()
    store = open_store(url)
    try:
        replies = {store.load(s.id).messages[-1].text for s in store.list_conversations()}
    finally:
        store.close()
    assert replies == {plain, streamed}
    assert plain.startswith("Echo: hello from langchain")
    assert streamed.startswith("Echo: stream from langchain")
