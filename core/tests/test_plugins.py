"""PluginHost: isolated loading, the allow/block lists, hook isolation, reports and statuses.

Entry points here are ``importlib.metadata.EntryPoint`` objects pointing at modules written
to a temporary directory; the real installed-distribution path is tested in ``tests/``.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable
from typing import Any

import jax
import pytest

import ejk
import ejk.plugins
from ejk import Invocation, KernelRegistry
from ejk.execution.device import device_fingerprint
from ejk.plugins import PlatformStatus, PluginHost, get_plugin_host, probe_platform, reset_plugin_host

GOOD = '''
import ejk

def impl(x, *, cfg=None):
    return x

@ejk.hookimpl
def ejk_register_kernels(register):
    register("good_op", "goodplat", "any", priority=3)(impl)

@ejk.hookimpl
def ejk_platform_status():
    return ejk.PlatformStatus(platform="goodplat", available=True, versions={"goodlib": "1.0"})
'''

IMPORT_ERROR = '''
import ejk
import ejk_toolkit_that_does_not_exist  # noqa: F401
'''

BAD_SIGNATURE = '''
import ejk

@ejk.hookimpl
def ejk_register_kernels(register, registry_v2):
    register("bad_op", "xla", "any")(lambda x: x)
'''

RAISES = '''
import ejk

@ejk.hookimpl
def ejk_register_kernels(register):
    register("partial_op", "raiseplat", "any")(lambda x: x)
    register("good_op", "raiseplat", "gpu")(lambda x: x)
    raise RuntimeError("cannot find libcuda.so")
'''


@pytest.fixture
def entry_points(make_module: Callable[[str], str]) -> Callable[..., list[importlib.metadata.EntryPoint]]:
    def make(**sources: str) -> list[importlib.metadata.EntryPoint]:
        return [importlib.metadata.EntryPoint(name=name, value=make_module(source), group="ejk")
                for name, source in sources.items()]

    return make


def new_host() -> PluginHost:
    return PluginHost(KernelRegistry(), load_entry_points=False)


# -- in-process plugins ---------------------------------------------------------------------------


def test_register_plugin_with_an_inline_class() -> None:
    host = new_host()

    class Mine:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("my_op", "mykernels", "cpu")(lambda x: x)

        @ejk.hookimpl
        def ejk_platform_status(self) -> list[PlatformStatus]:
            return [PlatformStatus(platform="mykernels", available=True, versions={"lib": "2"}),
                    PlatformStatus(platform="other", available=False, reason="no", fix="pip install other")]

    info = host.register_plugin(Mine(), "Mine", distribution="ejk-mine", version="0.1")
    assert info.status == "loaded" and info.error is None
    assert info.name == "mine"
    assert [s.platform for s in info.platforms] == ["mykernels", "other"]
    assert info.platforms[0].versions == (("lib", "2"),)
    assert host.platform_statuses()["other"].fix == "pip install other"
    assert host.registry.list_algorithms() == ["my_op"]
    assert host.plugins == {"mine": info}
    with pytest.raises(ValueError, match="already registered"):
        host.register_plugin(Mine(), "mine")


def test_module_plugins_and_hook_subsets(make_module: Callable[[str], str]) -> None:
    host = new_host()
    module = __import__(make_module(GOOD))
    host.register_plugin(module, "good")
    assert host.registry.get_spec("good_op").plugin.name == "good"  # type: ignore[union-attr]
    assert host.platform_statuses()["goodplat"].available


def test_a_plugin_with_an_available_status_wins_over_an_unavailable_one() -> None:
    host = new_host()

    def status(available: bool) -> object:
        class S:
            @ejk.hookimpl
            def ejk_platform_status(self) -> PlatformStatus:
                return PlatformStatus(platform="Shared", available=available, reason=None if available else "x")

        return S()

    host.register_plugin(status(True), "a")
    host.register_plugin(status(False), "b")
    assert host.platform_statuses()["shared"].available


# -- entry points and isolation -------------------------------------------------------------------


def test_broken_plugins_are_reported_and_the_others_load(entry_points: Any) -> None:
    eps = entry_points(alpha_good=GOOD, beta_import=IMPORT_ERROR, gamma_signature=BAD_SIGNATURE, delta_raises=RAISES)
    host = new_host()
    with pytest.warns(RuntimeWarning) as record:
        host.load_entry_points(eps)
    messages = [str(w.message) for w in record]
    assert len(messages) == 3
    assert all("was skipped" in m and "Fix:" in m for m in messages)

    good = host.plugins["alpha_good"]
    assert good.status == "loaded"
    assert host.registry.get("good_op", platform="goodplat").__name__ == "impl"

    imp = host.plugins["beta_import"]
    assert imp.status == "failed"
    assert "ModuleNotFoundError" in (imp.error or "") and "ejk_toolkit_that_does_not_exist" in (imp.error or "")
    assert "EJK_DISABLE_PLUGINS=beta_import" in (imp.fix or "")

    sig = host.plugins["gamma_signature"]
    assert sig.status == "failed"
    assert "invalid hooks" in (sig.error or "") and "registry_v2" in (sig.error or "")
    assert "hookspecs" in (sig.fix or "")
    assert "bad_op" not in host.registry.list_algorithms()

    raises = host.plugins["delta_raises"]
    assert raises.status == "failed"
    assert "cannot find libcuda.so" in (raises.error or "")
    assert "2 partial registration(s) rolled back" in (raises.error or "")
    assert "partial_op" not in host.registry.list_algorithms()
    assert [s.platform for s in host.registry.list_implementations("good_op")] == ["goodplat"]
    assert raises.ref.name not in host.pm.list_name_plugin()  # unregistered from pluggy too

    explained = "\n".join(host._explain())
    for name in ("beta_import", "gamma_signature", "delta_raises"):
        assert f"Plugin {name}" in explained
    assert "alpha_good" not in explained


def test_an_unknown_hook_name_is_reported(entry_points: Any) -> None:
    typo = 'import ejk\n\n@ejk.hookimpl\ndef ejk_register_kernel(register):\n    pass\n'
    optional = ('import ejk\n\n@ejk.hookimpl(optionalhook=True)\ndef ejk_future_hook(x):\n    pass\n\n'
                '@ejk.hookimpl\ndef ejk_register_kernels(register):\n    register("fut_op", "xla", "any")(len)\n')
    host = new_host()
    with pytest.warns(RuntimeWarning, match="ejk_register_kernel"):
        host.load_entry_points(entry_points(typo=typo, future=optional))
    assert host.plugins["typo"].status == "failed"
    assert "ejk_register_kernel" in (host.plugins["typo"].error or "")
    assert host.plugins["future"].status == "loaded"  # optionalhook=True: a hook of a newer ejk
    assert host.registry.list_algorithms() == ["fut_op"]


def test_entry_point_names_are_unique(entry_points: Any) -> None:
    first, second = entry_points(same=GOOD, other=GOOD)
    second = importlib.metadata.EntryPoint(name="SAME", value=second.value, group="ejk")
    host = new_host()
    host.load_entry_points([first, second])
    statuses = sorted(info.status for info in host.plugins.values())
    assert statuses == ["failed", "loaded"]
    failed = next(info for info in host.plugins.values() if info.status == "failed")
    assert "already used" in (failed.error or "")


def test_allow_list(entry_points: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    eps = entry_points(keep=GOOD, skip=IMPORT_ERROR)
    monkeypatch.setenv("EJK_PLUGINS", " Keep , unrelated ")
    host = new_host()
    host.load_entry_points(eps)  # the broken one is never imported: no warning
    assert host.plugins["keep"].status == "loaded"
    assert host.plugins["skip"].status == "disabled"
    assert host.plugins["skip"].error == "not in EJK_PLUGINS"
    assert eps[1].value not in sys.modules


def test_block_list(entry_points: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    eps = entry_points(keep=GOOD, skip=IMPORT_ERROR)
    monkeypatch.setenv("EJK_DISABLE_PLUGINS", "skip")
    host = new_host()
    host.load_entry_points(eps)
    assert host.plugins["keep"].status == "loaded"
    assert host.plugins["skip"].status == "disabled"
    assert host.plugins["skip"].error == "disabled by EJK_DISABLE_PLUGINS"
    assert eps[1].value not in sys.modules
    assert "Plugin skip (no distribution) was disabled" in "\n".join(host._explain())


def test_block_list_wins_over_allow_list(entry_points: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    eps = entry_points(both=GOOD)
    monkeypatch.setenv("EJK_PLUGINS", "both")
    monkeypatch.setenv("EJK_DISABLE_PLUGINS", "both")
    host = new_host()
    host.load_entry_points(eps)
    assert host.plugins["both"].status == "disabled"
    assert host.registry.list_algorithms() == []


# -- isolated hook calls --------------------------------------------------------------------------


class Answers:
    def __init__(self, platform: str, space: list[Any], heuristic: Any) -> None:
        self.platform, self.space, self.heuristic = platform, space, heuristic

    @ejk.hookimpl
    def ejk_config_space(self, algorithm: str, platform: str, invocation: Invocation[Any]) -> Any:
        return self.space if platform == self.platform else None

    @ejk.hookimpl
    def ejk_heuristic_config(self, algorithm: str, platform: str) -> Any:  # a subset of the arguments
        return self.heuristic if platform == self.platform else None


class Raising:
    @ejk.hookimpl
    def ejk_config_space(self, algorithm: str) -> Any:
        raise ZeroDivisionError("bad space")

    @ejk.hookimpl(tryfirst=True)
    def ejk_heuristic_config(self, algorithm: str) -> Any:
        raise LookupError("bad heuristic")


def test_exceptions_in_config_hooks_are_isolated() -> None:
    host = new_host()
    host.register_plugin(Answers("xla", [1, 2], "h-xla"), "xla-answers")
    host.register_plugin(Answers("xla", [3], "h-xla-2"), "more-answers")
    host.register_plugin(Answers("triton", [9], "h-triton"), "triton-answers")
    host.register_plugin(Raising(), "raising")
    inv = Invocation(op_id="op", version="1", args=(), call_key="k", device="cpu|cpu")
    with pytest.warns(RuntimeWarning, match="'raising': ejk_config_space raised ZeroDivisionError: bad space"):
        assert sorted(host.config_space("op", "xla", inv)) == [1, 2, 3]
    with pytest.warns(RuntimeWarning, match="'raising': ejk_heuristic_config raised LookupError"):
        assert host.heuristic_config("op", "triton", inv) == "h-triton"
    # The same failure is reported once; later calls stay quiet (warnings are errors here).
    assert host.config_space("op", "triton", inv) == [9]
    assert host.heuristic_config("op", "xla", inv) in ("h-xla", "h-xla-2")
    assert host.heuristic_config("op", "cute", inv) is None
    assert host.config_space("op", "cute", inv) == []
    assert host.plugins["raising"].hook_errors == [
        "ejk_config_space raised ZeroDivisionError: bad space",
        "ejk_heuristic_config raised LookupError: bad heuristic",
    ]
    assert host.plugins["raising"].status == "loaded"


def test_heuristic_config_first_result_follows_the_plugin_names() -> None:
    host = new_host()
    host.register_plugin(Answers("xla", [], "registered first"), "b")
    host.register_plugin(Answers("xla", [], "registered last"), "a")
    inv = Invocation(op_id="op", version="1", args=(), call_key="k", device="cpu|cpu")
    assert host.heuristic_config("op", "xla", inv) == "registered last"  # alphabetical: "a" answers first


def test_a_raising_status_hook_is_isolated() -> None:
    host = new_host()

    class BadStatus:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("op", "xla", "any")(len)

        @ejk.hookimpl
        def ejk_platform_status(self) -> Any:
            raise OSError("driver query failed")

    with pytest.warns(RuntimeWarning, match="ejk_platform_status raised OSError"):
        info = host.register_plugin(BadStatus(), "badstatus")
    assert info.status == "loaded" and info.platforms == []
    assert host.registry.get("op") is len


def test_device_facts_are_merged_and_key_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    host = new_host()

    class Facts:
        def __init__(self, facts: dict[str, Any] | None) -> None:
            self.facts = facts
            self.calls = 0

        @ejk.hookimpl
        def ejk_device_fingerprint(self, device: Any) -> Any:
            self.calls += 1
            return self.facts

    a, b, none = Facts({"sm": 90, "driver": "x y"}), Facts({"cores": "16"}), Facts(None)
    host.register_plugin(a, "a")
    host.register_plugin(b, "b")
    host.register_plugin(none, "none")
    device = jax.devices()[0]
    assert host.device_facts(device) == {"sm": "90", "driver": "x y", "cores": "16"}
    host.device_facts(device)
    assert a.calls == 1  # computed once per device

    plain = device_fingerprint(device, plugin_facts=False)
    assert plain == f"{device.platform}|{device.device_kind}".replace(" ", "_")
    monkeypatch.setattr(ejk.plugins, "_host", host)
    with_facts = device_fingerprint(device)
    assert with_facts == plain + "|cores=16|driver=x_y|sm=90"
    assert device_fingerprint() == with_facts


# -- the process-wide host ------------------------------------------------------------------------


def test_global_host_is_created_once_and_reset(entry_points: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    eps = entry_points(globalgood=GOOD)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: eps if group == "ejk" else [])
    monkeypatch.setattr(ejk.plugins, "_host", None)
    try:
        reset_plugin_host()
        assert ejk.kernel_registry._loaded is False
        # The global registry loads the plugins lazily, on its first query.
        assert ejk.kernel_registry.list_algorithms() == ["good_op"]
        host = get_plugin_host()
        assert host is get_plugin_host()
        assert host.registry is ejk.kernel_registry
        assert host.plugins["globalgood"].status == "loaded"
        reset_plugin_host()
        assert ejk.plugins._host is None
        assert ejk.kernel_registry._registry == {}
    finally:
        reset_plugin_host()


# -- probe_platform -------------------------------------------------------------------------------


def test_probe_platform_reports_missing_toolkits() -> None:
    status = probe_platform("mine", requires={"a_module_that_is_not_here": "not-here-dist"})
    assert not status.available
    assert status.reason == "not-here-dist not installed"
    assert status.fix == "pip install not-here-dist"


def test_probe_platform_checks_the_backend() -> None:
    backend = jax.default_backend()
    other = "tpu" if backend != "tpu" else "gpu"
    status = probe_platform("mine", requires={"jax": "jax"}, backends=(other,))
    assert not status.available
    assert f"JAX's default backend is {backend}" in (status.reason or "")
    assert dict(status.versions)["jax"] == jax.__version__
    ok = probe_platform("mine", requires={"jax": "jax"}, backends=(backend if backend != "cuda" else "gpu",))
    assert ok.available and ok.reason is None


def test_platform_status_normalises_and_freezes() -> None:
    status = PlatformStatus(platform="TRITON", available=False, versions={"b": "2", "a": "1"})
    assert status.platform == "triton"
    assert status.versions == (("a", "1"), ("b", "2"))
    assert hash(status) == hash(PlatformStatus(platform="triton", available=False, versions={"a": "1", "b": "2"}))
