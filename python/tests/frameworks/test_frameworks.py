"""LangChain, LlamaIndex and Haystack, unmodified, against ``vectide serve``.

Each framework has a venv of its own (``.venv-fw-langchain``,
``.venv-fw-llamaindex``, ``.venv-fw-haystack`` in the repo root, pinned by
``requirements-*.txt`` here and made by ``setup_venvs.py``); a test skips,
saying how to make it, when its venv is missing. The scenarios
(``run_*.py``) and the README snippets (``run_snippet.py``) run with that
venv's python inside a private network namespace (``unshare -n``, only
``lo`` up), so nothing in them -- a tokenizer, a model, a telemetry ping --
can reach the network unnoticed; each starts its own server on a free
loopback port.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
import fwcommon  # noqa: E402  (standard library only, shared with the scenarios)

FRAMEWORKS = ("langchain", "llamaindex", "haystack")

#: How many checks each complete scenario makes (a scenario that stops
#: early makes fewer; the test requires all of them to have run).
CHECKS = {"langchain": 35, "llamaindex": 29, "haystack": 35}

TIMEOUT = 300


def venv_python(name: str) -> Path:
    return REPO / f".venv-fw-{name}" / "bin" / "python"


def vectide_bin() -> str:
    here = Path(sys.executable).parent / "vectide"
    found = str(here) if here.exists() else shutil.which("vectide")
    if not found:
        fallback = REPO / ".venv" / "bin" / "vectide"
        found = str(fallback) if fallback.exists() else None
    if not found:
        pytest.fail("no vectide binary: build the project first (make)")
    return found


def need_venv(name: str) -> Path:
    py = venv_python(name)
    if not py.exists():
        pytest.skip(
            f"{py.parent.parent.name} is missing: make it with "
            f"`python3 python/tests/frameworks/setup_venvs.py {name}` (from the repo root)"
        )
    return py


def in_netns(argv: list[str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """``argv`` in a new network namespace with only the loopback up."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("the framework tests need `unshare` (util-linux) and `ip` (iproute2)")
    cmd = "ip link set lo up && exec " + shlex.join(argv)
    env = dict(os.environ, VECTIDE_BIN=vectide_bin(), PYTHONUNBUFFERED="1")
    env.pop("VECTIDE_URL", None)
    return subprocess.run(
        ["unshare", "-n", "sh", "-c", cmd], cwd=HERE, env=env, capture_output=True, text=True, timeout=timeout
    )


def last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def test_netns_has_no_network():
    """Inside ``unshare -n`` a non-loopback address fails at once with
    'Network is unreachable', while the loopback works."""
    probe = (
        "import errno, socket, time\n"
        "t = time.monotonic()\n"
        "try:\n"
        "    socket.create_connection(('192.0.2.1', 80), timeout=10)\n"
        "except OSError as e:\n"
        "    print('ERR', e.errno == errno.ENETUNREACH, round(time.monotonic() - t, 3), e)\n"
        "else:\n"
        "    print('CONNECTED')\n"
        "srv = socket.create_server(('127.0.0.1', 0))\n"
        "c = socket.create_connection(srv.getsockname(), timeout=5)\n"
        "print('LOOPBACK ok')\n"
    )
    r = in_netns([sys.executable, "-c", probe], timeout=60)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()[:2]
    _, unreachable, seconds, *msg = first.split(" ", 3)
    assert first.startswith("ERR True"), r.stdout
    assert "Network is unreachable" in first, r.stdout
    assert float(seconds) < 1.0, f"the refusal took {seconds} s: {r.stdout}"
    assert second == "LOOPBACK ok"


def test_network_attempts_are_caught():
    """The scenarios' and snippets' guard names an attempt to leave
    loopback -- a connect or a DNS lookup -- even when the caller swallows
    the error, and turns it into exit status 3."""
    probe = (
        "import socket, sys\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import fwcommon\n"
        "fwcommon.exit_nonzero_on_network_attempts()\n"
        "for target in (('192.0.2.1', 80), ('models.example.invalid', 443)):\n"
        "    try:\n"
        "        socket.create_connection(target, timeout=1)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    r = in_netns([sys.executable, "-c", probe], timeout=60)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "192.0.2.1" in r.stderr and "models.example.invalid" in r.stderr, r.stderr


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_framework(name):
    """The framework's scenario passes every check (``run_NAME.py``)."""
    py = need_venv(name)
    r = in_netns([str(py), f"run_{name}.py"])
    summary = last_json(r.stdout)
    others = "\n".join(line for line in r.stdout.splitlines() if not line.startswith('{"framework"'))
    detail = f"\n--- stdout (less the summary)\n{others[-4000:]}\n--- stderr\n{r.stderr[-6000:]}"
    assert summary is not None, f"run_{name}.py printed no summary (exit {r.returncode}){detail}"
    failures = "\n".join(f"  {f['check']}: {f['error'][:800]}" for f in summary["failures"])
    assert summary["failed"] == 0 and r.returncode == 0, f"{name}: {summary['failed']} check(s) failed:\n{failures}{detail}"
    assert summary["passed"] == CHECKS[name], f"{name}: {summary['passed']} checks ran, want {CHECKS[name]}{detail}"


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_readme_snippet(name):
    """The README's 'use it from NAME' snippet runs as written."""
    py = need_venv(name)
    r = in_netns([str(py), "run_snippet.py", name])
    summary = last_json(r.stdout)
    assert r.returncode == 0 and summary is not None and summary["returncode"] == 0, (
        f"snippet {name} failed\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-6000:]}"
    )


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_snippet_extracts(name):
    """Each snippet is one ```python block right after its marker, and
    connects through ``VECTIDE_URL`` with a localhost default."""
    path, code = fwcommon.snippet_source(name)
    assert 'os.environ.get("VECTIDE_URL", "http://localhost:6333")' in code, path
    assert "\nassert " in code, f"{path}: the snippet asserts nothing"
    compile(code, str(path), "exec")


def test_extract_snippet_errors(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("intro\n<!-- snippet: a -->\n\n```python\nprint(1)\n```\n<!-- snippet: b -->\n```sh\nls\n```\n")
    assert fwcommon.extract_snippet(md, "a") == "print(1)\n"
    with pytest.raises(LookupError, match="no ```python block"):
        fwcommon.extract_snippet(md, "b")
    with pytest.raises(LookupError, match="0 lines"):
        fwcommon.extract_snippet(md, "c")


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_requirements_are_pinned(name):
    """Every requirement is an exact ``==`` pin."""
    lines = [
        line.split("#")[0].strip() for line in (HERE / f"requirements-{name}.txt").read_text().splitlines()
    ]
    reqs = [line for line in lines if line]
    assert reqs and all("==" in r and not any(c in r for c in "<>~!*") for r in reqs), reqs
