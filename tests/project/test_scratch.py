"""The suite's scratch-base chooser (support/scratch.py): durable candidates only, in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import scratch


def test_an_ephemeral_override_is_refused_and_the_checkout_is_taken(tmp_path: Path) -> None:
    env = {scratch.ENV: "/dev/shm/chatstate-x", "HOME": str(tmp_path / "home")}
    assert scratch.choose(tmp_path, env) == tmp_path / ".pytest-tmp"
    assert not os.path.exists("/dev/shm/chatstate-x")  # a refused candidate is not created


def test_the_override_wins_when_durable(tmp_path: Path) -> None:
    env = {scratch.ENV: str(tmp_path / "mine"), "HOME": str(tmp_path / "home")}
    assert scratch.choose(tmp_path / "checkout", env) == tmp_path / "mine"
    assert (tmp_path / "mine").is_dir()


def test_a_checkout_under_tmp_falls_through_to_the_cache(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": "/nonexistent"}
    got = scratch.choose(Path("/tmp/chatstate-clone-never-made"), env)
    assert got == tmp_path / "cache" / "chatstate-tests"
    assert not os.path.exists("/tmp/chatstate-clone-never-made")


def test_the_cache_defaults_to_home(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home")}
    got = scratch.choose(Path("/tmp/chatstate-clone-never-made"), env)
    assert got == tmp_path / "home" / ".cache" / "chatstate-tests"


def test_nothing_durable_is_one_clear_line() -> None:
    env = {scratch.ENV: "/dev/shm/chatstate-x", "XDG_CACHE_HOME": "/run/chatstate-cache-x",
           "HOME": "/tmp"}
    with pytest.raises(scratch.NoScratch) as caught:
        scratch.choose(Path("/tmp/chatstate-clone-never-made"), env)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("chatstate tests: no durable scratch directory")
    for named in ("/dev/shm/chatstate-x", "/tmp/chatstate-clone-never-made/.pytest-tmp",
                  "/run/chatstate-cache-x/chatstate-tests", "ephemeral"):
        assert named in text, named
    assert text.endswith(f"Set {scratch.ENV} to a directory on a disk.")
    for never in ("/dev/shm/chatstate-x", "/tmp/chatstate-clone-never-made",
                  "/run/chatstate-cache-x"):
        assert not os.path.exists(never)


def test_run_folders_carry_boot_pid_namespace_and_pid() -> None:
    name = scratch.run_name()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    assert name == f"run-{boot}-{scratch.pid_namespace()}-{os.getpid()}"


def test_only_dead_runs_of_this_boot_and_namespace_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = scratch.run_prefix()
    mine_dead = tmp_path / f"{prefix}{dead.pid}"
    mine_live = tmp_path / f"{prefix}{os.getpid()}"
    other_ns = tmp_path / f"{prefix.rsplit('-', 2)[0]}-1-{dead.pid}"  # another container
    other_boot = tmp_path / f"run-000000000000-{scratch.pid_namespace()}-{dead.pid}"
    for d in (mine_dead, mine_live, other_ns, other_boot):
        (d / "sub").mkdir(parents=True)
    assert scratch.clean_dead_runs(tmp_path) == [mine_dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (mine_live, other_ns, other_boot))


def test_this_run_lives_on_a_durable_base(tmp_path: Path) -> None:
    from chatstate.durable.guard import inspect

    assert any(part.startswith(scratch.run_prefix()) for part in tmp_path.parts), tmp_path
    assert inspect(tmp_path).verdict == "durable"
