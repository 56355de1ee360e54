"""Every hook result is type-checked: a wrong type is reported against its plugin and hook, then ignored.

Issue 14: one plugin returning a dict from ``ejk_platform_status``, a string from
``ejk_device_fingerprint`` or an int from ``ejk_config_space`` broke every op everywhere.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import jax
import pytest

import ejk
import ejk.plugins
from ejk import Invocation, KernelRegistry, cli
from ejk.ops import ImplChoice, MatmulKernel
from ejk.plugins import PlatformStatus, PluginHost


@attrs.frozen
class GoodCfg:
    block: int = 8


class Good:
    """A well-behaved plugin serving ``op`` on ``goodplat``."""

    @ejk.hookimpl
    def ejk_register_kernels(self, register: Any) -> None:
        register("op", "goodplat", "any", cfg_type=GoodCfg)(lambda x, *, cfg=None: x)

    @ejk.hookimpl
    def ejk_platform_status(self) -> Any:
        return PlatformStatus(platform="goodplat", available=True)

    @ejk.hookimpl
    def ejk_device_fingerprint(self, device: Any) -> Any:
        return {"sm": 90}

    @ejk.hookimpl
    def ejk_config_space(self, algorithm: str, platform: str) -> Any:
        return [GoodCfg(8), GoodCfg(16)]

    @ejk.hookimpl
    def ejk_heuristic_config(self, algorithm: str, platform: str) -> Any:
        return GoodCfg(8)


class Bad:
    """Every hook returns the wrong type."""

    def __init__(self, status: Any) -> None:
        self.status = status

    @ejk.hookimpl
    def ejk_platform_status(self) -> Any:
        return self.status

    @ejk.hookimpl
    def ejk_device_fingerprint(self, device: Any) -> Any:
        return "sm90"

    @ejk.hookimpl
    def ejk_config_space(self, algorithm: str, platform: str) -> Any:
        return 7

    @ejk.hookimpl
    def ejk_heuristic_config(self, algorithm: str, platform: str) -> Any:
        return "fast please"


def _host(status: Any) -> PluginHost:
    host = PluginHost(KernelRegistry(), load_entry_points=False)
    host.register_plugin(Good(), "good")
    with pytest.warns(RuntimeWarning, match="'bad': ejk_platform_status returned"):
        host.register_plugin(Bad(status), "bad")  # "bad" < "good": asked first
    return host


@pytest.mark.parametrize("status", [{"platform": "x", "available": True}, "available", 3,
                                    [PlatformStatus(platform="x", available=True), "oops"]])
def test_wrong_platform_status_is_reported_and_ignored(status: Any) -> None:
    host = _host(status)
    bad = host.plugins["bad"]
    assert bad.status == "loaded" and bad.platforms == []
    (error,) = bad.hook_errors
    assert error.startswith(f"ejk_platform_status returned {type(status).__name__}")
    assert "must return an ejk.PlatformStatus or a sequence of them" in error
    assert host.platform_statuses()["goodplat"].available
    assert host.registry.get_spec("op", platform="auto", backend="cpu").platform == "goodplat"


def test_wrong_results_of_every_hook_are_ignored_and_the_other_plugin_answers() -> None:
    host = _host("nope")
    inv = Invocation(op_id="op", version="1", args=(), call_key="k", device="cpu|cpu")
    with pytest.warns(RuntimeWarning) as caught:
        assert host.device_facts(jax.devices()[0]) == {"sm": "90"}
        assert host.config_space("op", "goodplat", inv) == [GoodCfg(8), GoodCfg(16)]
        assert host.heuristic_config("op", "goodplat", inv) == GoodCfg(8)
    messages = " | ".join(str(w.message) for w in caught)
    assert "ejk_device_fingerprint returned str 'sm90' but must return a dict of str names" in messages
    assert "ejk_config_space returned int 7 but must return a list of configs" in messages
    assert "ejk_heuristic_config returned str 'fast please' but must return a config of op on goodplat" in messages
    assert len(host.plugins["bad"].hook_errors) == 4
    assert host.plugins["good"].hook_errors == []


def test_config_space_entries_of_the_wrong_type_are_dropped() -> None:
    class Mixed:
        @ejk.hookimpl
        def ejk_config_space(self, algorithm: str, platform: str) -> Any:
            return [GoodCfg(32), {"block": 1}]

    host = PluginHost(KernelRegistry(), load_entry_points=False)
    host.register_plugin(Good(), "good")
    host.register_plugin(Mixed(), "mixed")
    inv = Invocation(op_id="op", version="1", args=(), call_key="k", device="cpu|cpu")
    with pytest.warns(RuntimeWarning, match="'mixed': ejk_config_space returned dict"):
        assert host.config_space("op", "goodplat", inv) == [GoodCfg(8), GoodCfg(16), GoodCfg(32)]  # alphabetical


def test_choose_config_for_a_public_op_must_be_an_impl_choice_of_a_registered_implementation() -> None:
    answers: list[Any] = []

    class Chooser:
        @ejk.hookimpl
        def ejk_choose_config(self, invocation: Any, kernel: Any) -> Any:
            return answers[-1]

    host = PluginHost(KernelRegistry(), load_entry_points=False)
    host.register_plugin(Good(), "good")
    host.register_plugin(Chooser(), "chooser")
    kernel = MatmulKernel(host.registry)
    kernel.op_id = "op"  # the Good plugin's algorithm
    inv = Invocation(op_id="op", version="1", args=(), call_key="k", device="cpu|cpu")
    for wrong in (5, ImplChoice(platform="nowhere", backend="any"),
                  ImplChoice(platform="goodplat", backend="any", cfg={"block": 8})):
        answers.append(wrong)
        with pytest.warns(RuntimeWarning, match="ejk_choose_config returned"):
            assert host.choose_config(inv, kernel) is None
    answers.append(ImplChoice(platform="goodplat", backend="any", cfg=GoodCfg(4)))
    assert host.choose_config(inv, kernel) == answers[-1]
    assert len(host.plugins["chooser"].hook_errors) == 3


def test_plugins_and_doctor_show_the_hook_error(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    host = _host({"platform": "x"})
    monkeypatch.setattr(ejk.plugins, "_host", host)
    assert cli.main(["plugins", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["bad"]["hook_errors"] == [
        "ejk_platform_status returned dict {'platform': 'x'} but must return an ejk.PlatformStatus "
        "or a sequence of them"
    ]
    assert rows["good"]["hook_errors"] == []
    assert cli.main(["doctor"]) == 1
    assert "plugin bad: ejk_platform_status returned dict" in capsys.readouterr().out
