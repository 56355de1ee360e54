"""Extension arguments (``sinks``, ``precision`` of the attention ops): an implementation written before
them keeps working for the calls it can run, is skipped (with a reason) for those it cannot, and its
backward's missing cotangent is filled in by the core. Also the float64 reference of sinks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.ops import (
    FLASH_RESIDUALS,
    FlashAttentionKernel,
    FlashAttentionLseKernel,
    ImplChoice,
    fold_sinks,
    get_op,
    sinks_cotangent,
    without_residuals,
)
from ejk.plugins import PlatformStatus, PluginHost
from ejk.testing import assert_close, reference_flash_attention, reference_flash_attention_lse

CALLS: list[str] = []


def _lse2(lse: jax.Array) -> jax.Array:
    return jnp.where(jnp.isneginf(lse), jnp.inf, lse / math.log(2.0))


def old_fwd(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: Any, kv_segment_ids: Any, bias: Any,
            causal: bool, softmax_scale: float, sliding_window: Any, logits_soft_cap: Any, cfg: Any) -> Any:
    """An implementation written before sinks and precision: the contract of ejk-core 0.1."""
    CALLS.append("old")
    out, lse = reference_flash_attention_lse(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                             sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                                             q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias)
    return out, (q, k, v, q_segment_ids, kv_segment_ids, bias, out, _lse2(lse))


def old_bwd(residuals: Any, d_out: jax.Array, *, cfg: Any, **static: Any) -> tuple[Any, ...]:
    """Six cotangents (no sinks): the core inserts the seventh."""
    q, k, v, q_seg, kv_seg, bias, _, _ = residuals

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return reference_flash_attention(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, bias=bias, **static)

    _, pullback = jax.vjp(f, q, k, v)
    return (*pullback(d_out), None, None, None)


def new_fwd(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: Any, kv_segment_ids: Any, bias: Any,
            causal: bool, softmax_scale: float, sliding_window: Any, logits_soft_cap: Any, cfg: Any,
            sinks: Any = None, precision: str = "highest") -> Any:
    """One that takes both (the reference computes at full precision, whatever ``precision`` says)."""
    CALLS.append("new")
    out, lse = reference_flash_attention_lse(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                             sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                                             q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias,
                                             sinks=sinks)
    extra = () if sinks is None else (sinks,)
    return out, (q, k, v, q_segment_ids, kv_segment_ids, bias, out, _lse2(lse), *extra)


def new_bwd(residuals: Any, d_out: jax.Array, *, cfg: Any, d_lse: Any = None, precision: str = "highest",
            **static: Any) -> tuple[Any, ...]:
    """Seven cotangents (the sinks' too), through the lse when its cotangent comes."""
    q, k, v, q_seg, kv_seg, bias, _, lse2, *rest = residuals
    sinks = rest[0] if rest else None

    def f(q: jax.Array, k: jax.Array, v: jax.Array, sinks: Any) -> Any:
        return reference_flash_attention_lse(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg, bias=bias,
                                             sinks=sinks, **static)

    _, pullback = jax.vjp(f, q, k, v, sinks)
    dq, dk, dv, d_sinks = pullback((d_out, jnp.zeros(lse2.shape, jnp.float32) if d_lse is None else d_lse))
    return dq, dk, dv, None, None, None, d_sinks


def strict_gate(q: Any, k: Any, v: Any, q_segment_ids: Any = None, kv_segment_ids: Any = None, bias: Any = None, *,
                causal: bool = False, softmax_scale: float = 1.0, sliding_window: Any = None,
                logits_soft_cap: Any = None) -> str | None:
    """A gate that names every argument of ejk-core 0.1 and has no ``**kwargs``."""
    return None


def _plugin(name: str, registrations: Any) -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            registrations(register)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="xla", available=True)

    Plugin.__name__ = name
    return Plugin()


def _register_old(register: Any) -> None:
    register("flash_attention", "xla", "any", 10, name="old", capability=strict_gate,
             vjp=ejk.VJP(fwd=old_fwd, bwd=old_bwd, residuals=FLASH_RESIDUALS))(without_residuals(old_fwd))


def _register_new(register: Any) -> None:
    register("flash_attention", "xla", "any", 0, name="new", capability=strict_gate,
             vjp=ejk.VJP(fwd=new_fwd, bwd=new_bwd, residuals=FLASH_RESIDUALS, extra_cotangents=("lse",)))(
        without_residuals(new_fwd))


@pytest.fixture
def host() -> PluginHost:
    CALLS.clear()
    return ejk.plugins.get_plugin_host()  # the private, empty host of conftest


class Runner:
    """``flash_attention`` / ``flash_attention_lse`` through kernels bound to the test's registry."""

    def __init__(self, host: PluginHost, tmp_path: Path) -> None:
        self.kernel = FlashAttentionKernel(host.registry)
        self.lse_kernel = FlashAttentionLseKernel(host.registry)
        self.executor: ejk.Executor[Any, Any] = ejk.Executor(ejk.ConfigSelectorChain(persistent_dir=tmp_path))

    def __call__(self, *args: Any, lse: bool = False, platform: str = "auto", cfg: Any = None, **kwargs: Any) -> Any:
        kernel = self.lse_kernel if lse else self.kernel
        arrays, static = kernel.normalize(*args, **kwargs)
        choice = None if cfg is None else kernel.choice_for(cfg, platform)
        return self.executor(kernel, *arrays, cfg=choice, platform=platform, **static)


@pytest.fixture
def run(host: PluginHost, tmp_path: Path) -> Runner:
    return Runner(host, tmp_path)


def _inputs(dtype: Any = jnp.float32) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(0)  # Sq > Sk, causal: the first rows see no key
    shapes = ((1, 10, 4, 8), (1, 6, 2, 8), (1, 6, 2, 8))
    return tuple(jnp.asarray(rng.standard_normal(s), dtype) for s in shapes)


SINKS = jnp.asarray([0.5, -1.0, 2.0, 0.0], jnp.float32)


def test_an_implementation_without_the_extensions_registers_and_runs_legacy_calls(host: PluginHost,
                                                                                   run: Runner) -> None:
    host.register_plugin(_plugin("old", _register_old), "old")  # no KernelContractError
    contract = get_op("flash_attention").call_contract()
    assert contract is not None and "[sinks]" in contract.describe() and "[precision]" in contract.describe()
    q, k, v = _inputs(jnp.bfloat16)
    out = run(q, k, v, causal=True)  # bfloat16: precision normalises to the legacy "default"
    assert set(CALLS) == {"old"}
    assert_close(out, reference_flash_attention(q, k, v, causal=True), jnp.bfloat16)
    q, k, v = _inputs()
    run(q, k, v, causal=True, precision="default")  # float32 asking for the fast path
    assert set(CALLS) == {"old"}


def test_it_is_skipped_for_calls_it_cannot_run_and_says_why(host: PluginHost, run: Runner) -> None:
    host.register_plugin(_plugin("old", _register_old), "old")
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"does not take sinks= \(added to flash_attention in ejk-core"):
        run(q, k, v, causal=True, sinks=SINKS, precision="default", platform="xla")
    with pytest.raises(ValueError, match="does not take precision="):
        run(q, k, v, causal=True)  # float32: "highest" by default
    with pytest.raises(ValueError, match="does not take sinks="):  # a forced config skips the gate; the call refuses
        run(q, k, v, sinks=SINKS, precision="default",
                            cfg=ImplChoice(platform="xla", backend="any", implementation="old"))
    host.register_plugin(_plugin("new", _register_new), "new")
    CALLS.clear()
    out = run(q, k, v, causal=True, sinks=SINKS)
    assert set(CALLS) == {"new"}  # the higher-priority old one was skipped
    assert_close(out, reference_flash_attention(q, k, v, causal=True, sinks=SINKS), jnp.float32)
    report = ejk.explain(run.kernel, q, k, v, causal=True, sinks=SINKS, executor=run.executor)
    assert "does not take sinks=" in str(report) and "xla/any:new" in str(report)
    CALLS.clear()
    run(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), causal=True)
    assert set(CALLS) == {"old"}  # and used otherwise


def test_the_core_fills_in_the_cotangent_a_legacy_backward_does_not_return(host: PluginHost, run: Runner) -> None:
    host.register_plugin(_plugin("old", _register_old), "old")
    q, k, v = _inputs()

    def loss(fn: Any) -> Any:
        return lambda q, k, v: jnp.sum(fn(q, k, v) ** 2)

    got = jax.grad(loss(lambda q, k, v: run(q, k, v, causal=True, precision="default")),
                   argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(lambda q, k, v: reference_flash_attention(q, k, v, causal=True)), argnums=(0, 1, 2))(q, k, v)
    assert set(CALLS) == {"old"}
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, jnp.float32)


def test_sinks_gradients_through_an_implementation_that_takes_them(host: PluginHost, run: Runner) -> None:
    host.register_plugin(_plugin("new", _register_new), "new")
    q, k, v = _inputs()

    def loss(fn: Any) -> Any:
        def total(q: jax.Array, k: jax.Array, v: jax.Array, sinks: jax.Array) -> jax.Array:
            out, lse = fn(q, k, v, sinks)
            return jnp.sum(out ** 2) + jnp.sum(jnp.where(jnp.isfinite(lse), jnp.sin(lse), 0.0))
        return total

    ours = loss(lambda q, k, v, s: run(q, k, v, lse=True, causal=True, sinks=s))
    ref = loss(lambda q, k, v, s: reference_flash_attention_lse(q, k, v, causal=True, sinks=s))
    got = jax.grad(ours, argnums=(0, 1, 2, 3))(q, k, v, SINKS)
    want = jax.grad(ref, argnums=(0, 1, 2, 3))(q, k, v, SINKS)
    assert CALLS[-1] == "new"
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, jnp.float32)


def test_the_variant_and_the_gates_see_the_extensions(host: PluginHost, run: Runner) -> None:
    host.register_plugin(_plugin("old", _register_old), "old")
    host.register_plugin(_plugin("new", _register_new), "new")
    q, k, v = _inputs()
    out, lse = run(q, k, v, lse=True, causal=True, sinks=SINKS)
    want, want_lse = reference_flash_attention_lse(q, k, v, causal=True, sinks=SINKS)
    assert_close(out, want, jnp.float32)
    assert np.array_equal(np.isneginf(np.asarray(lse)), np.isneginf(np.asarray(want_lse)))
    kernel = run.kernel
    arrays, static = kernel.normalize(q, k, v, causal=True, sinks=SINKS)
    call = {**dict(zip(kernel.array_names, arrays, strict=True)), **static}
    old, new = (s for s in kernel.implementations() if s.name in ("old", "new"))
    assert "does not take sinks=" in (kernel._gate(old, call) or "")
    assert kernel._gate(new, call) is None  # its gate has no sinks parameter: it is called without it


def test_bad_sinks_and_precision_name_the_argument() -> None:
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"flash_attention: sinks has shape \(3,\) but needs \[q_heads\] = \(4,\)"):
        ejk.flash_attention(q, k, v, sinks=jnp.zeros(3))
    with pytest.raises(ValueError, match="sinks has dtype int32 but needs a floating dtype"):
        ejk.flash_attention(q, k, v, sinks=jnp.zeros(4, jnp.int32))
    with pytest.raises(ValueError, match="precision is 'fast' but needs"):
        ejk.flash_attention(q, k, v, precision="fast")
    with pytest.raises(ValueError, match="not an \\(lhs, rhs\\) pair"):
        ejk.flash_attention(q, k, v, precision=("highest", "default"))
    with pytest.raises(ValueError, match="ragged_paged_attention: sinks has shape"):
        ejk.ragged_paged_attention(jnp.zeros((1, 4, 8)), jnp.zeros((2, 4, 2, 8)), jnp.zeros((2, 4, 2, 8)),
                                   jnp.array([4]), jnp.array([[0]]), jnp.array([0, 1]), 1, sinks=jnp.zeros(2))


def test_precision_is_normalised_for_16_bit_inputs() -> None:
    kernel = FlashAttentionKernel()
    q, k, v = _inputs(jnp.bfloat16)
    assert kernel.normalize(q, k, v)[1]["precision"] == "default"
    q, k, v = _inputs()
    assert kernel.normalize(q, k, v)[1]["precision"] == "highest"
    assert kernel.normalize(q, k, v, precision=jax.lax.Precision.HIGH)[1]["precision"] == "high"
    with jax.default_matmul_precision("default"):
        assert kernel.normalize(q, k, v, precision=None)[1]["precision"] == "default"


def _numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, sinks: np.ndarray, scale: float,
                     mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 sinks attention written out: ``[B, Sq, H, D]`` and the lse (with the sink; -inf when empty)."""
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = np.where(mask, s, -np.inf)
    top = np.maximum(s.max(-1, keepdims=True), sinks[None, :, None, None])
    e = np.where(mask, np.exp(s - top), 0.0)
    seen = np.asarray(mask.any(-1, keepdims=True))
    denom = e.sum(-1, keepdims=True) + np.exp(sinks[None, :, None, None] - top)
    p = np.where(seen, e / denom, 0.0)
    lse = np.where(seen[..., 0], np.log(denom[..., 0]) + top[..., 0], -np.inf)
    return np.einsum("bhqk,bkhd->bqhd", p, v), lse


def test_the_reference_matches_a_float64_formula_values_and_sinks_gradient() -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in ((2, 7, 3, 5), (2, 4, 3, 5), (2, 4, 3, 5)))
    sinks = rng.standard_normal(3) * 2
    mask = np.broadcast_to(np.arange(4)[None, :] <= np.arange(7)[:, None] - 3, (2, 3, 7, 4))  # causal, Sq > Sk
    want, want_lse = _numpy_attention(q, k, v, sinks, 1 / math.sqrt(5), mask)
    with jax.enable_x64(True):
        args = tuple(jnp.asarray(x, jnp.float64) for x in (q, k, v, sinks))
        out, lse = reference_flash_attention_lse(*args[:3], causal=True, sinks=args[3])
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-12)
        d_out = jnp.asarray(rng.standard_normal(want.shape))
        _, pullback = jax.vjp(lambda s: reference_flash_attention(*args[:3], causal=True, sinks=s), args[3])
        (d_sinks,) = pullback(d_out)
        # the closed form the kernels use: d sink = -Σ_rows e^(sink - lse) rowsum(dO ∘ O), over rows that see a key
        lse2 = jnp.where(jnp.isneginf(lse), jnp.inf, lse / math.log(2.0))
        closed = sinks_cotangent(args[3], out, lse2, d_out)
        np.testing.assert_allclose(np.asarray(d_sinks), np.asarray(closed), rtol=1e-10, atol=1e-12)
        # a backward kernel's own delta (rowsum(dO ∘ O), [B, Hq, Sq]) gives the same, out and dO unread
        delta = jnp.swapaxes(jnp.sum(d_out * out, axis=-1), 1, 2)
        from_delta = sinks_cotangent(args[3], None, lse2, None, delta=delta)
        np.testing.assert_allclose(np.asarray(from_delta), np.asarray(closed), rtol=1e-12, atol=1e-14)
        step = 1e-6  # and a finite difference
        for h in range(3):
            bump = np.eye(3)[h] * step
            hi, _ = _numpy_attention(q, k, v, sinks + bump, 1 / math.sqrt(5), mask)
            lo, _ = _numpy_attention(q, k, v, sinks - bump, 1 / math.sqrt(5), mask)
            numeric = np.sum(np.asarray(d_out) * (hi - lo)) / (2 * step)
            assert abs(numeric - float(d_sinks[h])) < 1e-6


def test_fold_sinks_turns_a_result_without_sinks_into_one_with_them() -> None:
    q, k, v = _inputs()
    out, lse = reference_flash_attention_lse(q, k, v, causal=True)
    folded, lse2 = fold_sinks(out, _lse2(lse), SINKS)
    want, want_lse = reference_flash_attention_lse(q, k, v, causal=True, sinks=SINKS)
    assert_close(folded, want, jnp.float32)
    assert np.array_equal(np.asarray(lse2) == np.inf, np.isneginf(np.asarray(want_lse)))
    finite = np.isfinite(np.asarray(want_lse))
    np.testing.assert_allclose(np.asarray(lse2)[finite] * math.log(2.0), np.asarray(want_lse)[finite], rtol=1e-5)
