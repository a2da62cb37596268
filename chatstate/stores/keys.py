"""Where the encryption key comes from: always outside the store.

In order: ``CHATSTATE_ENCRYPTION_KEY`` (the key itself), ``CHATSTATE_KEY_FILE``
(a file holding it, refused unless only its owner can read it: mode 0600 or
0400), ``CHATSTATE_KEY_COMMAND`` (a command that prints it, run without a shell,
like git's credential helpers: a password manager, a cloud KMS CLI). A key
being rotated out is named the same way with ``OLD_`` (``CHATSTATE_OLD_ENCRYPTION_KEY``,
``CHATSTATE_OLD_KEY_FILE``, ``CHATSTATE_OLD_KEY_COMMAND``): accepted for reading only.

Errors name the variable and the file, never the key. Nothing here imports
``cryptography``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from chatstate.errors import ConfigurationError

VARIABLES = ("CHATSTATE_ENCRYPTION_KEY", "CHATSTATE_KEY_FILE", "CHATSTATE_KEY_COMMAND")


def configured(env: Mapping[str, str] | None = None) -> bool:
    """Is any key variable set (no I/O)?"""
    env = os.environ if env is None else env
    return any(env.get(name) for name in VARIABLES)


def load_key(env: Mapping[str, str] | None = None, *, old: bool = False) -> bytes | None:
    """The configured key's 32 bytes, or None when no key is configured."""
    from chatstate.stores.codec import parse_key  # here: configured() needs no codec

    env = os.environ if env is None else env
    prefix = "CHATSTATE_OLD_" if old else "CHATSTATE_"
    direct = prefix + ("ENCRYPTION_KEY")
    file_var, command_var = prefix + "KEY_FILE", prefix + "KEY_COMMAND"
    if env.get(direct):
        return parse_key(env[direct], direct)
    if env.get(file_var):
        return parse_key(_read_key_file(Path(env[file_var]), file_var), f"{file_var} "
                         f"({env[file_var]})")
    if env.get(command_var):
        return parse_key(_run_key_command(env[command_var], command_var), command_var)
    return None


def _read_key_file(path: Path, var: str) -> str:
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigurationError(
                f"{var}: refusing key file {path}: its mode is "
                f"{stat.S_IMODE(st.st_mode):04o}, readable by others; make it private with "
                f"`chmod 600 {path}`")
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"{var}: cannot read key file {path} "
                                 f"({exc.strerror or type(exc).__name__}); fix the path or "
                                 "unset it") from None


def _run_key_command(command: str, var: str) -> str:
    import shlex
    import subprocess

    try:
        argv = shlex.split(command)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"{var}: the key command could not run "
                                 f"({type(exc).__name__}); check the command") from None
    if done.returncode != 0:
        raise ConfigurationError(f"{var}: the key command exited with status "
                                 f"{done.returncode}; run it by hand to see why (its output "
                                 "is not shown: it may hold the key)")
    return done.stdout


def load_new_key(*, file: str | None = None, env_var: str | None = None,
                 command: str | None = None, env: Mapping[str, str] | None = None
                 ) -> bytes | None:
    """The key ``chatstate rekey`` rotates to, from the source its options name (a file,
    refused unless 0600 like ``CHATSTATE_KEY_FILE``; the name of an environment variable
    holding it; a command that prints it), or None when none is named."""
    from chatstate.stores.codec import parse_key

    env = os.environ if env is None else env
    if file:
        return parse_key(_read_key_file(Path(file), "--new-key-file"),
                         f"--new-key-file ({file})")
    if env_var:
        if not env.get(env_var):
            raise ConfigurationError(f"--new-key-env: the environment variable {env_var} is "
                                     "not set")
        return parse_key(env[env_var], env_var)
    if command:
        return parse_key(_run_key_command(command, "--new-key-command"), "--new-key-command")
    return None
