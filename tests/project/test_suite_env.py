"""The suite itself: it ignores the developer's environment, and a tier that cannot run
skips with its reason, or fails when CHATSTATE_REQUIRE_TIERS is set (as in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, TESTS, tiers

from chatstate.adapter.settings import DEFAULT_BASE_URL, DEFAULT_MODEL, ModelSettings


def test_no_developer_settings_reach_a_test() -> None:
    leaked = [k for k in os.environ if k.startswith(("CHATSTATE_", "OPENAI_"))
              and k not in ("CHATSTATE_REQUIRE_TIERS", "CHATSTATE_TEST_TMP")]
    assert leaked == []
    assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        assert not os.path.exists(os.environ[name]), name  # not ~/.aws
    assert not [k for k in os.environ if k.startswith("AWS_") and k not in (
        "AWS_EC2_METADATA_DISABLED", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")]


def test_the_working_directory_is_the_suites_own(tmp_path: Path) -> None:
    """A .env in the directory pytest was started from is never read: no test runs there."""
    cwd = Path.cwd()
    assert cwd.name.startswith("cwd"), cwd
    assert cwd.parent == tmp_path.parent, cwd
    assert not (cwd / ".env").exists()


def test_settings_start_from_their_defaults() -> None:
    settings = ModelSettings()
    assert settings.api_key is None
    assert (settings.model, settings.base_url) == (DEFAULT_MODEL, DEFAULT_BASE_URL)


def test_a_developers_shell_and_dotenv_reach_no_test(tmp_path: Path) -> None:
    """pytest started from a folder with a .env, in a shell full of settings: the two tests
    above still pass."""
    start = tmp_path / "dev"
    start.mkdir()
    (start / ".env").write_text("OPENAI_API_KEY=sk-from-dev-dotenv\nCHATSTATE_MODEL=dotenv\n"
                                "CHATSTATE_BASE_URL=http://dotenv.invalid/v1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AWS_"))}
    env.update(OPENAI_API_KEY="sk-from-dev-shell", CHATSTATE_MODEL="dev-model",
               AWS_ACCESS_KEY_ID="AKIA-dev", AWS_SECRET_ACCESS_KEY="dev-secret",
               AWS_PROFILE="dev")
    here = Path(__file__).resolve()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
         "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}",
         f"{here}::test_no_developer_settings_reach_a_test",
         f"{here}::test_settings_start_from_their_defaults"],
        cwd=start, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout


def test_moto_credentials_are_set_for_the_asking_test_only(
        request: pytest.FixtureRequest) -> None:
    """The S3 fixture's dummy credentials live as long as the test that asked for them
    (``no_leaked_credentials`` checks every later test starts without them)."""
    tiers.need_s3()
    request.getfixturevalue("moto_server")
    assert "AWS_ACCESS_KEY_ID" not in os.environ  # the running server sets nothing
    request.getfixturevalue("moto_endpoint")
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"


def test_a_missing_tier_skips_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiers, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception, match="strace tier: strace is not installed"):
        tiers.need("strace", False, "strace is not installed")
    tiers.need("strace", True, "never said")


def test_a_missing_tier_fails_when_tiers_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiers, "REQUIRED", True)
    with pytest.raises(pytest.fail.Exception, match="the FUSE tier cannot run: no /dev/fuse"):
        tiers.need("FUSE", False, "no /dev/fuse")


def test_ci_requires_every_tier_and_runs_the_readme_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")]
    assert "export CHATSTATE_REQUIRE_TIERS=1" in lines
    assert lines[-1] == "make test"


def test_a_broken_s3_store_import_fails_the_suite(tmp_path: Path) -> None:
    """Not "S3 not built yet" skips: an ImportError inside the s3 store is a failure."""
    tiers.need_s3()  # with the extra missing, there is nothing to break
    code = ("import sys, pytest\n"
            "sys.modules['chatstate.stores.s3.store'] = None  # importing it raises ImportError\n"
            f"sys.exit(pytest.main(['-q', '-n', '0', '-p', 'no:randomly', '-p', "
            f"'no:cacheprovider', '--basetemp={tmp_path / 'inner'}', "
            f"'{TESTS / 'contract' / 'test_store_contract.py'}', '-k', 'create_then_load']))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    out = done.stdout + done.stderr
    assert done.returncode not in (0, 5), out  # 5: nothing collected
    assert "skipped" not in out, out
    assert "chatstate.stores.s3.store" in out, out


HIDE_OBSTORE = "import sys\nsys.modules['obstore'] = None  # as if not installed\n"


def inner_run_without_obstore(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = HIDE_OBSTORE + (
        "import pytest\n"
        f"sys.exit(pytest.main(['-q', '-rs', '-n', '0', '-p', 'no:randomly', '-p', "
        f"'no:cacheprovider', '--basetemp={tmp_path / 'inner'}', "
        f"'{TESTS / 'contract' / 'test_store_contract.py'}', '-k', 'create_then_load']))\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("PYTEST_") and k != tiers.REQUIRE_ENV}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**clean, **env},
                          capture_output=True, text=True, timeout=180, check=False)


def test_without_obstore_the_s3_tier_skips_with_its_reason(tmp_path: Path) -> None:
    done = inner_run_without_obstore(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "4 passed, 1 skipped" in out, out  # json, sqlite, postgresql and memory:// ran
    assert "s3 tier: obstore (pip install 'chatstate[s3]') is not installed" in out, out


def test_without_obstore_a_required_s3_tier_fails(tmp_path: Path) -> None:
    done = inner_run_without_obstore(tmp_path, **{tiers.REQUIRE_ENV: "1"})
    out = done.stdout + done.stderr
    assert done.returncode not in (0, 5), out
    assert "the s3 tier cannot run: obstore" in out, out
