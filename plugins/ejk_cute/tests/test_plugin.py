"""The ejk-cute distribution: entry point, hooks and platform status on this machine."""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import pytest
from ejk.testing import check_plugin, expected_plugins


def test_plugin_conforms() -> None:
    info, _registry = check_plugin("cute")
    assert info.distribution == "ejk-cute"
    (status,) = info.platforms
    assert status.platform == "cute"
    if jax.default_backend() == "cpu":
        assert not status.available
        assert re.search(r"not installed|default backend is cpu|compute capability", status.reason or ""), status.reason
        assert status.fix


def test_expected_plugins_discovered() -> None:
    expected = expected_plugins()
    if expected is None:
        pytest.skip("EJK_EXPECT_PLUGINS is not set (set by the nox sessions)")
    from importlib.metadata import entry_points

    assert {ep.name for ep in entry_points(group="ejk")} == expected


def test_plugin_module_imports_without_its_toolkit() -> None:
    code = (
        "import sys, ejk_cute.plugin; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'cutlass', 'jax_triton')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
