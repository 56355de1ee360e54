"""Shared fixtures of the ejk-core test suite.

Every test runs with warnings as errors, a private process-wide plugin host (no installed
entry point is loaded in this process), a temporary ``EJK_CACHE_DIR`` and none of the
``EJK_*`` / ``EJKERNEL_OPS_*`` variables of the caller's shell.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ejk.plugins
from ejk.invocations import clear_invocations
from ejk.registry import KernelRegistry

_ENV = ("EJK_CACHE_DIR", "EJK_PLUGINS", "EJK_DISABLE_PLUGINS", "EJK_AUTOTUNE", "EJKERNEL_OPS_RECORD",
        "EJKERNEL_OPS_STAMP")


def pytest_configure(config: pytest.Config) -> None:
    # Warnings are errors (the workspace pyproject may say so too). The ini's own ignores (known third-party
    # deprecations) are appended again after "error", since a later filter wins: a run that collects this
    # directory beside a plugin's tests must not turn the plugin's known warnings into failures.
    ignores = [line for line in config.getini("filterwarnings") if line.strip().startswith("ignore")]
    for line in ("error", *ignores):
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture(autouse=True)
def _isolated_ejk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EJK_CACHE_DIR", str(tmp_path / "ejk-cache"))
    # The Executor asks the process-wide host for device facts: give it an empty, private one.
    monkeypatch.setattr(ejk.plugins, "_host", ejk.plugins.PluginHost(KernelRegistry(), load_entry_points=False))
    clear_invocations()
    yield
    clear_invocations()


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write a uniquely named importable module; returns its name (removed afterwards)."""
    root = tmp_path / "modules"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    names: list[str] = []

    def make(source: str) -> str:
        name = f"ejk_test_mod_{uuid.uuid4().hex[:12]}"
        (root / f"{name}.py").write_text(source, encoding="utf-8")
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def matmul_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ``ejk.matmul`` call that took the full path (its arguments validated)."""
    from ejk.ops._matmul._op import MATMUL

    count: list[int] = []
    normalize = MATMUL.normalize

    def counted(*args: Any, **kwargs: Any) -> Any:
        count.append(1)
        return normalize(*args, **kwargs)

    monkeypatch.setattr(MATMUL, "normalize", counted)
    return count
