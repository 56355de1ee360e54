"""Implementations compete per call: names, capability gates, per-implementation configs, VJP pairs,
frozen mode, device facts per platform and ``ejk.explain`` (a toy op, registered by inline plugins)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.ops import ImplChoice, OpKernel
from ejk.plugins import PlatformStatus, PluginHost

X = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32).reshape(8, 8)


@attrs.frozen(kw_only=True)
class FastCfg:
    unroll: int = 1


@attrs.frozen(kw_only=True)
class SlowCfg:
    work: int = 64


class ToyKernel(OpKernel):
    """``toy(x, *, limit)``: ``2 * x``; implementations may refuse large ``limit``."""

    op_id = "toy"
    version = "1"
    array_names = ("x",)
    positional = 1

    def normalize(self, x: Any, *, limit: int = 0) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x,), {"limit": int(limit)}


def fast(x: jax.Array, *, limit: int, cfg: FastCfg | None) -> jax.Array:
    return 2 * x


def slow(x: jax.Array, *, limit: int, cfg: SlowCfg | None) -> jax.Array:
    work = (cfg or SlowCfg()).work
    big = jnp.tile(x, (work, work))
    burn = jax.lax.fori_loop(0, 8, lambda _, m: jnp.tanh(m @ m) , big)
    return 2 * x + 0.0 * jnp.sum(burn)


def refuses_large(x: Any, *, limit: int) -> str | None:
    return f"limit {limit} > 4 not supported" if limit > 4 else None


def _plugin(name: str, registrations: Callable[[Any], None], platform: str,
            facts: dict[str, str] | None = None, available: bool = True) -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            registrations(register)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform=platform, available=available,
                                  reason=None if available else "no such device", fix="buy one")

        @ejk.hookimpl
        def ejk_device_fingerprint(self, device: Any) -> dict[str, str] | None:
            return facts

    Plugin.__name__ = name
    return Plugin()


@pytest.fixture
def host() -> PluginHost:
    return ejk.plugins.get_plugin_host()  # the private, empty host of conftest


def toy_plugins(host: PluginHost, *, gate_slow: bool = False, gate_fast: bool = False) -> ToyKernel:
    def register(reg: Any) -> None:
        reg("toy", "xla", "any", priority=10, name="slow", cfg_type=SlowCfg,
            config_space=lambda **_: [SlowCfg(work=32), SlowCfg(work=64)], heuristic=lambda **_: SlowCfg(),
            capability=refuses_large if gate_slow else None)(slow)
        reg("toy", "xla", "any", priority=0, name="fast", cfg_type=FastCfg,
            config_space=lambda **_: [FastCfg(unroll=1), FastCfg(unroll=2)], heuristic=lambda **_: FastCfg(),
            capability=refuses_large if gate_fast else None)(fast)

    host.register_plugin(_plugin("toyplugin", register, "xla"), "toyplugin", distribution="toy-dist")
    return ToyKernel(host.registry)


def executor(tmp_path: Path, events: list[Any], **policy: Any) -> ejk.Executor[Any, Any]:
    policy.setdefault("repeats", 3)
    chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(
        policy=ejk.AutotunePolicy(**policy), persistent_dir=tmp_path / "cache", on_event=events.append)
    return ejk.Executor(chain)


def test_the_faster_implementation_wins_and_is_persisted_by_name(host: PluginHost, tmp_path: Path) -> None:
    kernel = toy_plugins(host)
    events: list[Any] = []
    out = executor(tmp_path, events, mode="autotune")(kernel, X, limit=0, platform="auto")
    np.testing.assert_allclose(out, 2 * X)
    (tuned,) = [e for e in events if e.tier == "autotune"]
    assert tuned.cfg.implementation == "fast" and isinstance(tuned.cfg.cfg, FastCfg)
    labels = {kernel.cfg_label(t.cfg) for t in tuned.tune.trials}
    assert labels == {"xla/any:slow", "xla/any:fast"}  # both implementations, each with its own configs
    assert all(isinstance(t.cfg.cfg, SlowCfg if t.cfg.implementation == "slow" else FastCfg)
               for t in tuned.tune.trials)
    (path,) = (tmp_path / "cache").glob("toy*.json")
    (entry,) = json.loads(path.read_text())["entries"]["cpu|cpu"]["toy@1"].values()
    assert entry["cfg"]["implementation"] == "fast" and set(entry["provenance"]["by_implementation"]) == labels
    # A new chain (a new process) rebuilds the winner from disk: same implementation, same config type.
    again: list[Any] = []
    executor(tmp_path, again, mode="autotune")(kernel, X, limit=0, platform="auto")
    assert [e.tier for e in again] == ["persistent"] and again[0].cfg == tuned.cfg


def test_the_heuristics_tier_takes_the_best_ranked_usable_implementation(host: PluginHost, tmp_path: Path) -> None:
    kernel = toy_plugins(host, gate_slow=True)
    events: list[Any] = []
    run = executor(tmp_path, events, mode="heuristics")
    run(kernel, X, limit=0, platform="auto")
    run(kernel, X, limit=9, platform="auto")
    assert [(e.tier, e.cfg.implementation) for e in events] == [("heuristic", "slow"), ("heuristic", "fast")]
    assert events[0].cfg.cfg == SlowCfg() and events[1].cfg.cfg == FastCfg()


def test_a_gate_that_refuses_is_skipped_when_tuning(host: PluginHost, tmp_path: Path) -> None:
    kernel = toy_plugins(host, gate_fast=True)
    events: list[Any] = []
    executor(tmp_path, events, mode="autotune")(kernel, X, limit=9, platform="auto")
    (tuned,) = [e for e in events if e.tier == "autotune"]
    assert {t.cfg.implementation for t in tuned.tune.trials} == {"slow"}


def test_cached_choices_whose_implementation_now_refuses_are_not_used(host: PluginHost, tmp_path: Path) -> None:
    kernel = toy_plugins(host, gate_fast=True)
    events: list[Any] = []
    run = executor(tmp_path, events, mode="heuristics")
    inv = run.invocation(kernel, (X,), {"limit": 9, "platform": "auto"})
    fast_choice = ImplChoice(platform="xla", backend="any", implementation="fast", cfg=FastCfg())
    chain = run.chooser
    persistent = chain.persistent_cache(kernel)
    persistent.put(*inv.cache_key, fast_choice, source="autotune")  # tuned when fast still ran it
    with ejk.overlay_cache({inv.cache_key: fast_choice}):
        chain.cache.put(*inv.cache_key, fast_choice)
        run(kernel, X, limit=9, platform="auto")
    (event,) = events
    assert event.tier == "heuristic" and event.cfg.implementation == "slow"
    for tier in ("overlay", "memory", "persistent"):
        assert f"{tier} xla/any:fast" in event.detail and "limit 9 > 4 not supported" in event.detail


def test_a_forced_platform_that_cannot_run_the_call_names_the_reason_and_who_can(host: PluginHost,
                                                                                 tmp_path: Path) -> None:
    toy_plugins(host)

    def other(reg: Any) -> None:
        reg("toy", "pallas", "any", name="kernel", capability=lambda x, *, limit: "limit must be 0" if limit else None,
            )(fast)

    host.register_plugin(_plugin("other", other, "pallas"), "other")
    kernel = ToyKernel(host.registry)
    run = executor(tmp_path, [], mode="heuristics")
    with pytest.raises(ValueError, match=r"platform=pallas can run this call.*limit must be 0.*Implementations that "
                                         r"can: xla/any:slow, xla/any:fast"):
        run(kernel, X, limit=3, platform="pallas")
    np.testing.assert_allclose(run(kernel, X, limit=0, platform="pallas"), 2 * X)


def test_an_explicit_cfg_is_type_checked_and_gated(host: PluginHost, tmp_path: Path) -> None:
    kernel = toy_plugins(host, gate_fast=True)
    run = executor(tmp_path, [], mode="heuristics")
    assert kernel.choice_for(FastCfg(unroll=2), "auto").implementation == "fast"
    assert kernel.choice_for(SlowCfg(), "xla").implementation == "slow"
    with pytest.raises(ValueError, match="matches no available implementation"):
        kernel.choice_for(object(), "auto")
    wrong = ImplChoice(platform="xla", backend="any", implementation="fast", cfg=SlowCfg())
    with pytest.raises(ValueError, match="xla/any:fast takes FastCfg, not SlowCfg"):
        run(kernel, X, limit=0, platform="auto", cfg=wrong)
    with pytest.raises(ValueError, match="limit 9 > 4 not supported"):
        run(kernel, X, limit=9, platform="auto", cfg=kernel.choice_for(FastCfg(), "auto"))


def test_frozen_mode_raises_on_a_miss_and_runs_on_a_hit(host: PluginHost, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = toy_plugins(host)
    monkeypatch.setenv("EJK_AUTOTUNE", "frozen")
    events: list[Any] = []
    run = executor(tmp_path, events)
    with pytest.raises(ejk.FrozenConfigMissError, match=r"frozen policy: no tuned config for toy@1\(8x8:float32"
                                                        r".*EJK_AUTOTUNE=autotune"):
        run(kernel, X, limit=0, platform="auto")
    executor(tmp_path, [], mode="autotune")(kernel, X, limit=0, platform="auto")  # tune offline, persisted
    out = executor(tmp_path, events)(kernel, X, limit=0, platform="auto")  # a new process, frozen
    np.testing.assert_allclose(out, 2 * X)
    assert [e.tier for e in events] == ["persistent"]


def test_a_fact_of_one_platform_leaves_the_other_platforms_entries_valid(host: PluginHost, tmp_path: Path) -> None:
    kernel = toy_plugins(host)
    executor(tmp_path, [], mode="autotune")(kernel, X, limit=0, platform="auto")
    # Installing a plugin of another platform that adds a device fact keeps the xla entry.
    host.register_plugin(_plugin("gpuplugin", lambda reg: None, "triton", facts={"sm": "90"}), "gpuplugin")
    ejk.plugins.get_plugin_host()._platform_facts.clear()
    events: list[Any] = []
    executor(tmp_path, events, mode="autotune")(kernel, X, limit=0, platform="auto")
    assert [e.tier for e in events] == ["persistent"]
    # A new fact of the entry's own platform makes it stale: it is tuned again.
    host.register_plugin(_plugin("xlafacts", lambda reg: None, "xla", facts={"driver": "2"}), "xlafacts")
    host._platform_facts.clear()
    events.clear()
    with pytest.warns(ejk.StaleCacheWarning, match="device facts of platform xla changed"):
        executor(tmp_path, events, mode="autotune")(kernel, X, limit=0, platform="auto")
    assert [e.tier for e in events] == ["autotune"]


# -- VJP pairs ----------------------------------------------------------------------------------------

def square(x: jax.Array, *, cfg: Any) -> jax.Array:
    return x * x


def square_fwd(x: jax.Array, *, cfg: Any) -> tuple[jax.Array, Any]:
    return x * x, (x,)


def square_bwd(residuals: Any, g: jax.Array, *, cfg: Any) -> tuple[jax.Array]:
    (x,) = residuals
    return (2 * x * g,)


def marked_bwd(residuals: Any, g: jax.Array, *, cfg: Any) -> tuple[jax.Array]:
    (x,) = residuals
    return (2 * x * g + 1000.0,)  # visibly this backward


class SquareKernel(OpKernel):
    op_id = "square"
    version = "1"
    array_names = ("x",)
    positional = 1


def square_plugins(host: PluginHost) -> SquareKernel:
    def register(reg: Any) -> None:
        reg("square", "xla", "any", name="a",
            vjp=ejk.VJP(fwd=square_fwd, bwd=square_bwd, residuals="square:x"))(square)
        reg("square", "xla", "any", name="b",
            vjp=ejk.VJP(fwd=square_fwd, bwd=marked_bwd, residuals="square:x"))(square)
        reg("square", "xla", "any", name="c",
            vjp=ejk.VJP(fwd=square_fwd, bwd=square_bwd, residuals="square:other"))(square)

    host.register_plugin(_plugin("squares", register, "xla"), "squares")
    return SquareKernel(host.registry)


def test_gradients_through_the_executors_vjp_match_autodiff(host: PluginHost, tmp_path: Path) -> None:
    kernel = square_plugins(host)
    run = executor(tmp_path, [], mode="heuristics")
    a = ImplChoice(platform="xla", backend="any", implementation="a")
    got = jax.grad(lambda x: run(kernel, x, platform="auto", cfg=a).sum())(X)
    np.testing.assert_allclose(got, jax.grad(lambda x: (x * x).sum())(X), rtol=1e-6)
    assert kernel.uses_custom_vjp(a)


def test_a_forward_pairs_with_a_compatible_backward(host: PluginHost, tmp_path: Path) -> None:
    kernel = square_plugins(host)
    run = executor(tmp_path, [], mode="heuristics")
    b_backward = ImplChoice(platform="xla", backend="any", implementation="b")
    mixed = ImplChoice(platform="xla", backend="any", implementation="a", backward=b_backward)
    got = jax.grad(lambda x: run(kernel, x, platform="auto", cfg=mixed).sum())(X)
    np.testing.assert_allclose(got, 2 * X + 1000.0, rtol=1e-6)  # a's forward, b's backward
    clash = ImplChoice(platform="xla", backend="any", implementation="a",
                       backward=ImplChoice(platform="xla", backend="any", implementation="c"))
    with pytest.raises(ValueError, match="consumes residuals 'square:other'"):
        run(kernel, X, platform="auto", cfg=clash)


# -- explain -------------------------------------------------------------------------------------------

def test_explain_names_the_tier_and_why_not_the_others(host: PluginHost, tmp_path: Path) -> None:
    kernel = toy_plugins(host, gate_slow=True)
    host.register_plugin(_plugin("gone", lambda reg: reg("toy", "cute", "any", name="fa3")(fast), "cute",
                                 available=False), "gone")
    events: list[Any] = []
    run = executor(tmp_path, events, mode="heuristics")
    found = ejk.explain(kernel, X, limit=9, executor=run)
    assert found.tier == "heuristic" and found.chosen is not None and found.chosen.implementation == "fast"
    by_label = {r.label: r for r in found.implementations}
    assert by_label["xla/any:fast"].status == "chosen"
    assert by_label["xla/any:slow"].status == "refused" and "limit 9 > 4" in (by_label["xla/any:slow"].reason or "")
    assert by_label["cute/any:fa3"].status == "unavailable" and "buy one" in (by_label["cute/any:fa3"].reason or "")
    assert found.to_json()["tier"] == "heuristic"
    assert events == []  # explain decides nothing

    tuned = executor(tmp_path, [], mode="autotune")
    tuned(kernel, X, limit=0, platform="auto")
    again = ejk.explain(kernel, X, limit=0, executor=tuned)
    assert again.tier == "memory" and again.chosen is not None and again.chosen.implementation == "fast"
    slow_report = {r.label: r for r in again.implementations}["xla/any:slow"]
    assert slow_report.status == "usable" and slow_report.slowdown is not None and slow_report.slowdown > 1
    assert "the chosen one's time" in (slow_report.reason or "")


def test_explain_of_a_public_op_with_abstract_arguments() -> None:
    q = jax.ShapeDtypeStruct((2, 16, 4, 8), jnp.float32)
    with pytest.raises(ejk.KernelNotFoundError):  # core alone: nothing registered, said clearly
        ejk.explain("flash_attention", q, q, q, causal=True)
    with pytest.raises(ValueError, match="unknown operation 'nope'"):
        ejk.explain("nope", q)


# -- one op definition ------------------------------------------------------------------------------

def test_an_op_defined_in_one_place_appears_everywhere(host: PluginHost, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A new op: a kernel class, a public function and ``define_op`` — then ``ejk.<name>``,
    ``ejk.explain``, ``ejk.testing.check_op`` and ``ejk kernels`` know it."""
    from ejk import cli, testing
    from ejk.ops import OPS, define_op, run_op

    class DoubleKernel(OpKernel):
        op_id = "toy_double"
        version = "1"
        array_names = ("x",)
        positional = 1

        def normalize(self, x: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if getattr(x, "ndim", None) != 2:
                raise ValueError(f"toy_double: x has shape {getattr(x, 'shape', None)} but needs 2 dimensions")
            return (x,), {}

    kernel = DoubleKernel(host.registry)

    def toy_double(x: jax.Array, *, platform: str = "auto", cfg: Any = None) -> jax.Array:
        return run_op(kernel, *kernel.normalize(x), platform, cfg)  # type: ignore[no-any-return]

    def check(platform: str) -> int:
        np.testing.assert_allclose(toy_double(X, platform=platform), 2 * X)
        return 1

    define_op(kernel, toy_double, reference=lambda x: 2 * x, check=check)
    try:
        assert ejk.toy_double is toy_double  # type: ignore[attr-defined]
        assert cli.main(["kernels", "toy_double"]) == 0
        assert "no implementation" in capsys.readouterr().out
        host.register_plugin(_plugin("doubler", lambda reg: reg("toy_double", "xla", "any", name="mul")(
            lambda x, *, cfg: 2 * x), "xla"), "doubler")
        assert testing.check_op("toy_double", "xla") == 1
        assert ejk.explain("toy_double", X).chosen.implementation == "mul"  # type: ignore[union-attr]
        assert cli.main(["kernels", "toy_double", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["name"] == "mul"
        with pytest.raises(ValueError, match="already defined"):
            define_op(kernel, lambda x: x)
    finally:
        OPS.pop("toy_double", None)
