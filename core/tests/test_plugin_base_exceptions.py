"""A plugin raising SystemExit or another BaseException is isolated; KeyboardInterrupt still stops (issue 14)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import ejk
from ejk import KernelRegistry
from ejk.plugins import PluginHost

GOOD = '''
import ejk

@ejk.hookimpl
def ejk_register_kernels(register):
    register("good_op", "goodplat", "any")(lambda x, *, cfg=None: x)
'''


class Custom(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


@pytest.fixture
def entry_points(make_module: Callable[[str], str]) -> Callable[..., list[importlib.metadata.EntryPoint]]:
    def make(**sources: str) -> list[importlib.metadata.EntryPoint]:
        return [importlib.metadata.EntryPoint(name=name, value=make_module(source), group="ejk")
                for name, source in sources.items()]

    return make


@pytest.mark.parametrize("statement", ["import sys; sys.exit(3)", "raise SystemExit('bye')",
                                       "raise GeneratorExit()", "class B(BaseException): pass\nraise B('odd')"])
def test_base_exceptions_on_import_are_isolated(entry_points: Any, statement: str) -> None:
    eps = entry_points(a_exits=statement, b_good=GOOD)
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    with pytest.warns(RuntimeWarning, match="'a_exits'.*was skipped: import of .* failed"):
        host.load_entry_points(eps)
    assert host.plugins["a_exits"].status == "failed"
    assert host.plugins["b_good"].status == "loaded"
    assert host.registry.list_algorithms() == ["good_op"]


def test_base_exceptions_in_hooks_are_isolated() -> None:
    class Exits:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("exit_op", "x", "any")(len)
            raise SystemExit(1)

    class Weird:
        @ejk.hookimpl
        def ejk_heuristic_config(self, algorithm: str) -> Any:
            raise Custom("no")

    host = PluginHost(KernelRegistry(), load_entry_points=False)
    with pytest.warns(RuntimeWarning, match="ejk_register_kernels raised SystemExit"):
        assert host.register_plugin(Exits(), "exits").status == "failed"
    assert "exit_op" not in host.registry.list_algorithms()
    host.register_plugin(Weird(), "weird")
    with pytest.warns(RuntimeWarning, match="ejk_heuristic_config raised .*Custom: no"):
        assert host.heuristic_config("op", "x", None) is None


def test_keyboard_interrupt_is_reported_then_stops(entry_points: Any) -> None:
    eps = entry_points(a_interrupts="raise KeyboardInterrupt", b_good=GOOD)
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    with pytest.warns(RuntimeWarning, match="'a_interrupts'.*KeyboardInterrupt"), pytest.raises(KeyboardInterrupt):
        host.load_entry_points(eps)
    assert host.plugins["a_interrupts"].status == "failed"


def test_ejk_plugins_command_survives_a_plugin_that_exits(tmp_path: Any) -> None:
    # A real entry point whose module calls sys.exit(): `ejk plugins` must list it, not exit silently.
    site = tmp_path / "site"
    (site / "exiting_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "exiting_plugin-1.0.dist-info" / "METADATA").write_text("Name: exiting-plugin\nVersion: 1.0\n")
    (site / "exiting_plugin-1.0.dist-info" / "entry_points.txt").write_text("[ejk]\nexiting = exiting_plugin\n")
    (site / "exiting_plugin.py").write_text("import sys\nsys.exit(0)\n")
    code = textwrap.dedent("""
        import sys
        from ejk import cli
        sys.exit(cli.main(["plugins", "--json"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={"PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu", "EJK_PLUGINS": "exiting",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert rows["exiting"]["status"] == "failed" and "SystemExit" in rows["exiting"]["error"]
