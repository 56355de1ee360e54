"""Careless and hostile plugins (issue 28): an interrupted load can be retried, hook results
whose repr raises are isolated, probes and doctor see what a plugin really returns."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import pytest

import ejk.plugins
from ejk import KernelRegistry

GOOD = '''
import ejk

@ejk.hookimpl
def ejk_register_kernels(register):
    register("good_op", "goodplat", "any")(lambda x, *, cfg=None: x)
'''

INTERRUPTED_ONCE = '''
import os
import ejk

if os.environ.pop("EJK_TEST_INTERRUPT_IMPORT", None):  # the user's Ctrl-C, during the first import only
    raise KeyboardInterrupt

@ejk.hookimpl
def ejk_register_kernels(register):
    register("late_op", "lateplat", "any")(lambda x, *, cfg=None: x)
'''


@pytest.fixture
def entry_points(make_module: Callable[[str], str]) -> Callable[..., list[importlib.metadata.EntryPoint]]:
    def make(**sources: str) -> list[importlib.metadata.EntryPoint]:
        return [importlib.metadata.EntryPoint(name=name, value=make_module(source), group="ejk")
                for name, source in sources.items()]

    return make


@pytest.fixture
def global_host(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[importlib.metadata.EntryPoint]], KernelRegistry]:
    """A registry loaded lazily through the process-wide host, from the given entry points."""

    def make(eps: list[importlib.metadata.EntryPoint]) -> KernelRegistry:
        monkeypatch.setattr(ejk.plugins, "_host", None)
        monkeypatch.setattr(ejk.plugins, "_ready_host", None)
        monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps)
        return KernelRegistry(loader=lambda registry: ejk.plugins.get_plugin_host(registry=registry) and None)

    return make


def test_an_interrupted_first_load_is_retried_by_the_next_call(entry_points: Any, global_host: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    registry = global_host(entry_points(a_good=GOOD, b_late=INTERRUPTED_ONCE))
    monkeypatch.setenv("EJK_TEST_INTERRUPT_IMPORT", "1")
    with pytest.warns(RuntimeWarning, match="KeyboardInterrupt"), pytest.raises(KeyboardInterrupt):
        registry.list_algorithms()
    assert registry.list_algorithms() == ["good_op", "late_op"]  # loaded again, in full
    host = ejk.plugins.get_plugin_host()
    assert {name: info.status for name, info in host.plugins.items()} == {"a_good": "loaded", "b_late": "loaded"}
    assert host.registry is registry


def test_an_interrupt_outside_plugin_code_leaves_loading_retryable(entry_points: Any, global_host: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    registry = global_host(entry_points(a_good=GOOD))
    real = ejk.plugins.PluginHost.load_entry_points
    loads: list[ejk.plugins.PluginHost] = []

    def interrupted(self: ejk.plugins.PluginHost, eps: Any = None) -> None:
        loads.append(self)
        real(self, eps)
        if len(loads) == 1:
            raise KeyboardInterrupt  # e.g. Ctrl-C just after the last plugin

    monkeypatch.setattr(ejk.plugins.PluginHost, "load_entry_points", interrupted)
    with pytest.raises(KeyboardInterrupt):
        registry.list_algorithms()
    assert registry.list_algorithms() == ["good_op"]
    assert len(loads) == 2 and ejk.plugins.get_plugin_host() is loads[1]
    assert [s.plugin.name for s in registry.list_implementations("good_op") if s.plugin] == ["a_good"]
