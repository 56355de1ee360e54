"""Fixtures of the cross-distribution tests.

``testplugin_site`` builds and installs the third-party test distribution
``tests/plugins/ejk_testplugin`` into a temporary directory (never into the development
environment); ``run_python`` runs code in a fresh interpreter with that directory on its
path, so entry-point discovery is exercised for real without touching this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TESTPLUGIN_SOURCE = Path(__file__).parent / "plugins" / "ejk_testplugin"
_ENV = ("EJK_CACHE_DIR", "EJK_PLUGINS", "EJK_DISABLE_PLUGINS", "EJK_AUTOTUNE", "EJKERNEL_OPS_RECORD",
        "EJKERNEL_OPS_STAMP", "PYTHONPATH", "PYTHONWARNINGS")


def pytest_configure(config: pytest.Config) -> None:
    # Warnings are errors (the workspace pyproject may say so too). The ini's own ignores (known third-party
    # deprecations) are appended again after "error", since a later filter wins: a run that collects this
    # directory beside a plugin's tests must not turn the plugin's known warnings into failures.
    ignores = [line for line in config.getini("filterwarnings") if line.strip().startswith("ignore")]
    for line in ("error", *ignores):
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture(scope="session")
def testplugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the installed ``ejk-testplugin`` distribution (its dist-info and package)."""
    work = tmp_path_factory.mktemp("ejk-testplugin")
    source = work / "source"
    shutil.copytree(TESTPLUGIN_SOURCE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "dist"))
    site = work / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, f"installing the test plugin failed:\n{proc.stdout}\n{proc.stderr}"
    assert (site / "ejk_testplugin" / "plugin.py").is_file()
    assert list(site.glob("ejk_testplugin-0.3.1.dist-info/entry_points.txt"))
    return site


RunPython = Callable[..., Any]


@pytest.fixture
def run_python(tmp_path: Path) -> RunPython:
    """``run_python(code, path=None, **env)``: run ``code`` in a fresh interpreter; returns the JSON
    object printed on its last line of stdout. ``path`` is prepended to ``PYTHONPATH``."""

    def run(code: str, path: Path | None = None, **env: str) -> Any:
        environ = {k: v for k, v in os.environ.items() if k not in _ENV}
        environ.update({"JAX_PLATFORMS": "cpu", "EJK_CACHE_DIR": str(tmp_path / "ejk-cache")})
        if path is not None:
            environ["PYTHONPATH"] = str(path)
        environ.update(env)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ,
                              cwd=tmp_path, timeout=180, check=False)
        assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        lines = proc.stdout.strip().splitlines()
        assert lines, f"subprocess printed nothing:\n{proc.stderr}"
        return json.loads(lines[-1])

    return run
