"""chatstate's benchmarks, side by side with the tools a user would pick instead.

``python -m bench`` (``make bench``) runs every scenario in one go and writes
``bench/results.md``:

1. durable append cost per turn vs transcript length, with fsyncs counted by strace;
2. load + verify of long transcripts, ``chatstate replay``, peak memory;
3. streaming overhead of persist-before-render against the bare openai SDK;
4. start-up time of the CLI;
5. batch throughput (``bench/batch_throughput.py``).

Comparison libraries (LangChain, the OpenAI Agents SDK, simonw's llm) live in
their own virtualenv, ``bench/.venv``, created on first run, and are driven as
subprocesses by small standalone driver scripts (``drv_*.py``) that answer JSON.
Every store the bench writes lives under ``bench/work/`` on the checkout's own
disk, never /tmp. See ``bench/README.md``.
"""
