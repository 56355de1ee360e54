"""Careless and hostile plugins (issue 28): an interrupted load can be retried, hook results
whose repr raises are isolated, probes and doctor see what a plugin really returns."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
import ejk.registry
from ejk import KernelRegistry, cli
from ejk.ops import ImplChoice
from ejk.plugins import PlatformStatus, PluginHost

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


# -- hook results whose repr or str raises ----------------------------------------------------------------

class Unprintable:
    """A hook result that cannot be shown."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __str__(self) -> str:
        raise RuntimeError("no str")


class UnprintableName(str):
    """A str whose own ``str()`` raises (it passes an isinstance check)."""

    def __str__(self) -> str:
        raise RuntimeError("no str")


@attrs.frozen
class ToyCfg:
    tile: int = 1


class Toy:
    """Serves ``toy_show`` on ``toyplat``."""

    @ejk.hookimpl
    def ejk_register_kernels(self, register: Any) -> None:
        register("toy_show", "toyplat", "any", cfg_type=ToyCfg)(lambda x, *, cfg=None: x + 1)

    @ejk.hookimpl
    def ejk_platform_status(self) -> Any:
        return PlatformStatus(platform="toyplat", available=True)


@attrs.frozen(repr=False)
class UnprintableToyCfg(ToyCfg):
    """A config of the right class that cannot be shown."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _returning(**answers: Any) -> object:
    """A plugin whose hooks return the given values."""

    class Answers:
        @ejk.hookimpl
        def ejk_platform_status(self) -> Any:
            return answers.get("status")

        @ejk.hookimpl
        def ejk_device_fingerprint(self, device: Any) -> Any:
            return answers.get("fingerprint")

        @ejk.hookimpl
        def ejk_choose_config(self, invocation: Any, kernel: Any) -> Any:
            return answers.get("choice")

    return Answers()


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> PluginHost:
    private: PluginHost = ejk.plugins.get_plugin_host()  # the private, empty host of conftest
    monkeypatch.setattr(ejk.registry, "kernel_registry", private.registry)  # what ejk.run looks in
    return private


def test_a_platform_status_that_cannot_be_shown_is_reported_and_later_plugins_load(host: PluginHost) -> None:
    with pytest.warns(RuntimeWarning, match="'a_bad': ejk_platform_status returned Unprintable"):
        host.register_plugin(_returning(status=Unprintable()), "a_bad")
    host.register_plugin(Toy(), "toy")
    assert host.plugins["toy"].status == "loaded" and host.registry.list_algorithms() == ["toy_show"]
    np.testing.assert_allclose(ejk.run("toy_show", jnp.zeros(2)), [1.0, 1.0])


@pytest.mark.parametrize("choice", [Unprintable(), ImplChoice(platform="toyplat", backend="any", cfg=Unprintable()),
                                    ImplChoice(platform="toyplat", backend="any", cfg=UnprintableToyCfg())])
def test_a_choice_that_cannot_be_shown_is_reported_and_the_op_runs(host: PluginHost, choice: Any) -> None:
    host.register_plugin(Toy(), "toy")
    host.register_plugin(_returning(choice=choice), "chooser")
    with pytest.warns(RuntimeWarning, match="'chooser': ejk_choose_config returned"):
        np.testing.assert_allclose(ejk.run("toy_show", jnp.zeros(2)), [1.0, 1.0])
    assert host.plugins["chooser"].hook_errors


@pytest.mark.parametrize("fingerprint", [Unprintable(), {"sm": UnprintableName("90")}, {UnprintableName("sm"): "90"}])
def test_a_fingerprint_that_cannot_be_shown_is_reported_and_doctor_runs(
        host: PluginHost, fingerprint: Any, capsys: pytest.CaptureFixture[str]) -> None:
    host.register_plugin(Toy(), "toy")
    host.register_plugin(_returning(fingerprint=fingerprint), "printer")
    with pytest.warns(RuntimeWarning, match="'printer': ejk_device_fingerprint returned"):
        assert host.device_facts(jax.devices()[0]) == {}
    assert cli.main(["doctor"]) == 1
    assert "plugin printer: ejk_device_fingerprint returned" in capsys.readouterr().out


# -- ejk doctor asks every hook ----------------------------------------------------------------------------

class Careless:
    """Serves matmul on its own platform; its choice, config space and packs hooks return the wrong types."""

    @ejk.hookimpl
    def ejk_register_kernels(self, register: Any) -> None:
        register("matmul", "toyplat", "any", cfg_type=ToyCfg)(lambda a, b, *, precision, preferred_element_type,
                                                                     cfg=None: a @ b)

    @ejk.hookimpl
    def ejk_platform_status(self) -> Any:
        return PlatformStatus(platform="toyplat", available=True)

    @ejk.hookimpl
    def ejk_choose_config(self, invocation: Any, kernel: Any) -> Any:
        return "fast please"

    @ejk.hookimpl
    def ejk_config_space(self, algorithm: str, platform: str) -> Any:
        return 7

    @ejk.hookimpl
    def ejk_config_packs(self) -> Any:
        return 5


def test_doctor_asks_the_choice_config_space_and_packs_hooks(host: PluginHost,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    host.register_plugin(Careless(), "careless")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    for hook, returned in (("ejk_choose_config", "str"), ("ejk_config_space", "int"), ("ejk_config_packs", "int")):
        assert f"plugin careless: {hook} returned {returned}" in out, out


def test_probe_platform_with_backend_any_runs_everywhere() -> None:
    status = ejk.plugins.probe_platform("anyplat", backends=("any",))
    assert status.available and status.reason is None
    assert ejk.plugins.probe_platform("anyplat", backends=("ANY", "tpu")).available


# -- ejk.testing.check_plugin catches them in a plugin's own CI ---------------------------------------------

CARELESS_CHOOSER = '''
import ejk

@ejk.hookimpl
def ejk_register_kernels(register):
    register("matmul", "toyplat", "any")(lambda a, b, *, precision, preferred_element_type, cfg=None: a @ b)

@ejk.hookimpl
def ejk_platform_status():
    return ejk.PlatformStatus(platform="toyplat", available=True)

@ejk.hookimpl
def ejk_choose_config(invocation, kernel):
    return "fast please"
'''

UNPRINTABLE_FINGERPRINT = '''
import ejk

class Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr")

@ejk.hookimpl
def ejk_platform_status():
    return ejk.PlatformStatus(platform="toyplat", available=True)

@ejk.hookimpl
def ejk_device_fingerprint(device):
    return Unprintable()
'''

WRONG_PACKS = '''
import ejk

@ejk.hookimpl
def ejk_platform_status():
    return ejk.PlatformStatus(platform="toyplat", available=True)

@ejk.hookimpl
def ejk_config_packs():
    return "packs/h100.json"
'''


@pytest.mark.parametrize(("source", "hook"), [(CARELESS_CHOOSER, "ejk_choose_config returned str"),
                                              (UNPRINTABLE_FINGERPRINT, "ejk_device_fingerprint returned"),
                                              (WRONG_PACKS, "ejk_config_packs returned str")])
def test_check_plugin_catches_wrong_hook_results(entry_points: Any, monkeypatch: pytest.MonkeyPatch,
                                                 source: str, hook: str) -> None:
    from ejk.testing import ConformanceError, check_plugin

    eps = entry_points(careless=source)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps)
    with pytest.raises(ConformanceError, match=hook):
        check_plugin("careless")
