"""Executor: calls, config choice, compile, custom VJP, profiler stamps, trace-time selection."""

from __future__ import annotations

import json
import threading
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk import AutotunePolicy, ConfigChooser, ConfigSelectorChain, Executor, Invocation, Kernel


@attrs.frozen
class Cfg:
    factor: float = 1.0


class CountingChooser:
    """A ConfigChooser that returns a fixed config and counts how often it is asked."""

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg if cfg is not None else Cfg()
        self.calls: list[Invocation[Any]] = []
        self._lock = threading.Lock()

    def choose(self, inv: Invocation[Any], kernel: Kernel[Any, Any]) -> Any:
        with self._lock:
            self.calls.append(inv)
        return self.cfg


class Scale(Kernel[Cfg, jax.Array]):
    """out = x * factor * (1 + bias); ``prepare`` turns python lists into arrays."""

    op_id = "scale"
    version = "2"

    def __init__(self) -> None:
        self.runs = 0

    def prepare(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(jnp.asarray(a) for a in args), kwargs

    def run(self, x: jax.Array, *, cfg: Cfg, bias: float = 0.0) -> jax.Array:
        self.runs += 1
        return x * cfg.factor * (1.0 + bias)


X = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)


def test_chooser_protocol() -> None:
    assert isinstance(CountingChooser(), ConfigChooser)
    assert isinstance(ConfigSelectorChain(plugin_host=False), ConfigChooser)
    assert not isinstance(object(), ConfigChooser)


def test_call_uses_chosen_config_and_prepare() -> None:
    chooser = CountingChooser(Cfg(factor=3.0))
    ex: Executor[Cfg, jax.Array] = Executor(chooser)
    np.testing.assert_allclose(ex(Scale(), X), X * 3)
    np.testing.assert_allclose(ex(Scale(), [1.0, 2.0], bias=1.0), [6.0, 12.0])
    assert len(chooser.calls) == 2
    inv = chooser.calls[1]
    assert inv.op_id_v == "scale@2"
    assert dict(inv.kwargs) == {"bias": 1.0}
    assert inv.args[0].shape == (2,)  # prepared
    assert inv.override_cfg is None


def test_explicit_cfg_skips_the_chooser() -> None:
    chooser = CountingChooser(Cfg(factor=3.0))
    ex: Executor[Cfg, jax.Array] = Executor(chooser)
    np.testing.assert_allclose(ex(Scale(), X, cfg=Cfg(factor=-1.0)), -X)
    assert ex.choose_config(Scale(), X, cfg=Cfg(factor=5.0)) == Cfg(factor=5.0)
    assert chooser.calls == []


def test_choose_config_does_not_run_the_kernel() -> None:
    chooser = CountingChooser(Cfg(factor=4.0))
    ex: Executor[Cfg, jax.Array] = Executor(chooser)
    kernel = Scale()
    assert ex.choose_config(kernel, X, bias=0.5) == Cfg(factor=4.0)
    assert kernel.runs == 0
    assert len(chooser.calls) == 1
    assert chooser.calls[0].call_key == ex.invocation(kernel, (X,), {"bias": 0.5}).call_key


def test_eager_calls_reuse_the_bound_function() -> None:
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser())
    kernel = Scale()
    for _ in range(4):
        ex(kernel, X)
    assert kernel.runs == 1  # traced once, then the cached jitted function runs
    ex(kernel, X, bias=2.0)
    assert kernel.runs == 2


def test_without_jit_the_kernel_runs_eagerly() -> None:
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser(Cfg(factor=2.0)), jit=False)
    kernel = Scale()
    ex(kernel, X)
    ex(kernel, X)
    assert kernel.runs == 2
    compiled = ex.compile(kernel, X)
    np.testing.assert_allclose(compiled(X + 1), (X + 1) * 2)


def test_compile_returns_a_callable_for_the_example_signature() -> None:
    chooser = CountingChooser(Cfg(factor=2.0))
    ex: Executor[Cfg, jax.Array] = Executor(chooser)
    kernel = Scale()
    compiled = ex.compile(kernel, X, bias=1.0)
    assert len(chooser.calls) == 1
    assert compiled.config == Cfg(factor=2.0)  # type: ignore[attr-defined]
    np.testing.assert_allclose(compiled(X + 1, bias=1.0), (X + 1) * 4)
    np.testing.assert_allclose(compiled([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], bias=1.0),
                               [[4.0] * 3, [8.0] * 3])  # prepare runs on every call
    assert len(chooser.calls) == 1  # no new selection per call
    with pytest.raises(ValueError, match="compiled for keyword arguments"):
        compiled(X, bias=2.0)
    with pytest.raises(ValueError, match="compile again"):
        compiled(X)
    with pytest.raises(TypeError):
        compiled(jnp.ones((3, 3)), bias=1.0)  # other shape: the executable refuses it
    assert ex.compile(kernel, X, cfg=Cfg(factor=7.0)).config == Cfg(factor=7.0)  # type: ignore[attr-defined]
    assert len(chooser.calls) == 1


# -- trace-time selection -------------------------------------------------------------------------


def test_under_jit_the_chooser_runs_at_trace_time_only() -> None:
    chooser = CountingChooser(Cfg(factor=2.0))
    ex: Executor[Cfg, jax.Array] = Executor(chooser)
    kernel = Scale()

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        return ex(kernel, x) + 1

    for i in range(5):
        np.testing.assert_allclose(f(X + i), (X + i) * 2 + 1)
    assert len(chooser.calls) == 1
    assert isinstance(chooser.calls[0].args[0], jax.core.Tracer)
    f(jnp.ones((4,)))  # a new signature retraces and chooses again
    assert len(chooser.calls) == 2
    assert chooser.calls[0].call_key != chooser.calls[1].call_key


def test_under_jit_with_the_selector_chain() -> None:
    events: list[Any] = []
    chain: ConfigSelectorChain[Cfg] = ConfigSelectorChain(policy=AutotunePolicy(autotune=False), plugin_host=False,
                                                          on_event=events.append, persist=False)

    class WithHeuristic(Scale):
        def heuristic_cfg(self, inv: Invocation[Cfg]) -> Cfg:
            return Cfg(factor=5.0)

    ex: Executor[Cfg, jax.Array] = Executor(chain)
    f = jax.jit(lambda x: ex(WithHeuristic(), x))
    for _ in range(5):
        np.testing.assert_allclose(f(X), X * 5)
    assert [e.tier for e in events] == ["heuristic"]


def test_call_keys_are_memoised_per_signature() -> None:
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser())
    kernel = Scale()
    a = ex.invocation(kernel, (X,), {"bias": 1.0})
    b = ex.invocation(kernel, (X + 1,), {"bias": 1.0})
    c = ex.invocation(kernel, (X.astype(jnp.bfloat16),), {"bias": 1.0})
    d = ex.invocation(kernel, (X,), {"bias": 1.0}, batch_axes=0)
    assert a.call_key == b.call_key
    assert len({a.call_key, c.call_key, d.call_key}) == 3
    assert a.device == ex.invocation(kernel, (X,), {}).device


def test_call_keys_do_not_depend_on_call_history() -> None:
    from ejk.execution.kernel import make_call_key

    kernel = Scale()
    values = (1, True, 1.0, (1, 2), (1.0, 2), [1, 2])
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser())
    keys = [ex.invocation(kernel, (X,), {"flag": v}).call_key for v in values]
    assert keys == [make_call_key("scale@2", (X,), {"flag": v}) for v in values]
    assert len(set(keys)) == 5  # a tuple and a list of the same items describe the same static value


# -- custom VJP -----------------------------------------------------------------------------------


class SinMul(Kernel[Cfg, jax.Array]):
    """y = x * sin(w) * factor, with a hand-written backward pass scaled by ``bwd_scale``."""

    op_id = "sin_mul"

    def __init__(self, bwd_scale: float = 1.0) -> None:
        self.bwd_scale = bwd_scale
        self.fwd_calls = 0
        self.bwd_calls = 0

    def run(self, x: jax.Array, w: jax.Array, *, cfg: Cfg, power: int = 1) -> jax.Array:
        return x * jnp.sin(w) ** power * cfg.factor

    def fwd(self, x: jax.Array, w: jax.Array, *, cfg: Cfg, power: int = 1) -> tuple[jax.Array, Any]:
        self.fwd_calls += 1
        return self.run(x, w, cfg=cfg, power=power), (x, w)

    def bwd(self, residuals: Any, g: jax.Array, *, cfg: Cfg, power: int = 1) -> tuple[jax.Array, jax.Array]:
        self.bwd_calls += 1
        x, w = residuals
        s = jnp.sin(w)
        dx = g * s**power * cfg.factor
        dw = g * x * power * s ** (power - 1) * jnp.cos(w) * cfg.factor
        return dx * self.bwd_scale, dw * self.bwd_scale


def plain(x: jax.Array, w: jax.Array, factor: float, power: int = 1) -> jax.Array:
    return x * jnp.sin(w) ** power * factor


XS = jnp.linspace(-2.0, 3.0, 12, dtype=jnp.float32).reshape(3, 4)
WS = jnp.linspace(0.3, 2.5, 12, dtype=jnp.float32).reshape(3, 4)


@pytest.mark.parametrize("power", [1, 3])
def test_custom_vjp_gradient_matches_autodiff_of_the_reference(power: int) -> None:
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser(Cfg(factor=1.5)))
    kernel = SinMul()
    assert kernel.has_custom_vjp and not Scale().has_custom_vjp

    def loss(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.sum(ex(kernel, x, w, power=power) ** 2)

    def ref_loss(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.sum(plain(x, w, 1.5, power) ** 2)

    np.testing.assert_allclose(loss(XS, WS), ref_loss(XS, WS), rtol=1e-5)
    got = jax.grad(loss, argnums=(0, 1))(XS, WS)
    want = jax.grad(ref_loss, argnums=(0, 1))(XS, WS)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    assert kernel.bwd_calls >= 1
    jit_got = jax.jit(jax.grad(loss, argnums=(0, 1)))(XS, WS)
    for g, r in zip(jit_got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_the_custom_backward_is_what_runs() -> None:
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser(Cfg(factor=1.0)))
    kernel = SinMul(bwd_scale=3.0)  # a deliberately "wrong" backward: autodiff would not scale by 3
    out, vjp = jax.vjp(lambda x, w: ex(kernel, x, w), XS, WS)
    np.testing.assert_allclose(out, plain(XS, WS, 1.0), rtol=1e-6)
    dx, dw = vjp(jnp.ones_like(out))
    np.testing.assert_allclose(dx, 3.0 * jnp.sin(WS), rtol=1e-5)
    np.testing.assert_allclose(dw, 3.0 * XS * jnp.cos(WS), rtol=1e-5, atol=1e-6)
    assert kernel.fwd_calls == 1 and kernel.bwd_calls == 1


def test_custom_vjp_under_vmap() -> None:
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser(Cfg(factor=2.0)))
    kernel = SinMul()
    batched = jax.vmap(lambda x, w: ex(kernel, x, w))(XS, WS)
    np.testing.assert_allclose(batched, plain(XS, WS, 2.0), rtol=1e-6)
    grads = jax.vmap(jax.grad(lambda x, w: jnp.sum(ex(kernel, x, w))))(XS, WS)
    np.testing.assert_allclose(grads, 2.0 * jnp.sin(WS), rtol=1e-5)


# -- stamps ---------------------------------------------------------------------------------------


def _lowered_text(ex: Executor[Cfg, jax.Array], kernel: Kernel[Cfg, jax.Array]) -> str:
    # Named scopes live in the location metadata of the lowered module.
    return jax.jit(lambda x: ex(kernel, x, bias=0.25)).lower(X).as_text(debug_info=True)


def test_stamp_hash_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser(), stamp_prefix="my_prefix")
    kernel = Scale()
    text = _lowered_text(ex, kernel)
    key = ex.invocation(kernel, (X,), {"bias": 0.25}).call_key
    assert f"my_prefix#scale#{key[:16]}" in text
    monkeypatch.setenv("EJKERNEL_OPS_STAMP", "HASH")
    assert f"my_prefix#scale#{key[:16]}" in _lowered_text(Executor(CountingChooser(), stamp_prefix="my_prefix"),
                                                          kernel)


def test_stamp_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJKERNEL_OPS_STAMP", "json")
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser(), stamp_prefix="my_prefix")
    kernel = Scale()
    text = _lowered_text(ex, kernel)
    key = ex.invocation(kernel, (X,), {"bias": 0.25}).call_key
    assert "my_prefix#{" in text
    assert key in text and "scale@2" in text and "bias" in text
    stamp = ex._stamp(ex.invocation(kernel, (X,), {"bias": 0.25}), "json")
    assert stamp is not None
    assert json.loads(stamp.split("#", 1)[1]) == {"op": "scale@2", "call_key": key, "kwargs": {"bias": 0.25}}


def test_stamp_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJKERNEL_OPS_STAMP", "none")
    text = _lowered_text(Executor(CountingChooser(), stamp_prefix="my_prefix"), Scale())
    assert "my_prefix" not in text


def test_invalid_stamp_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJKERNEL_OPS_STAMP", "verbose")
    with pytest.raises(ValueError, match=r"EJKERNEL_OPS_STAMP='verbose'.*hash, json, none"):
        Executor(CountingChooser())(Scale(), X)


def test_under_jit_the_kernel_is_inlined_not_a_nested_call() -> None:
    """Traced inside a caller's ``jit`` the bound kernel leaves no nested call in the lowered module
    (jax 0.11.2's Shardy pass segfaulted on GPUs on such a call inside ``shard_map`` bodies)."""
    ex: Executor[Cfg, jax.Array] = Executor(CountingChooser(Cfg(factor=2.0)))
    kernel = Scale()
    text = jax.jit(lambda x: ex(kernel, x) + 1).lower(X).as_text()
    assert "@scale" not in text, text
    np.testing.assert_allclose(ex(kernel, X), X * 2)  # eager calls still run through the cached jit
