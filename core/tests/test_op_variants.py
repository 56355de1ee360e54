"""``flash_attention_lse`` is a variant of ``flash_attention``: an implementation whose VJP saves the
flash residuals (with the base-2 lse) provides it, its backward taking the lse cotangent when the VJP
says so (``extra_cotangents``); an implementation registered for the variant itself shadows it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk import cli
from ejk.ops import FLASH_RESIDUALS, FlashAttentionLseKernel, without_residuals
from ejk.plugins import PlatformStatus, PluginHost
from ejk.testing import assert_close, reference_flash_attention_lse

OPTIONS = {"causal": True, "softmax_scale": 0.25, "sliding_window": None, "logits_soft_cap": None}


def _static(q_segment_ids: Any, kv_segment_ids: Any, bias: Any, **static: Any) -> dict[str, Any]:
    return {**static, "q_segment_ids": q_segment_ids, "kv_segment_ids": kv_segment_ids, "bias": bias}


def fwd(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: Any, kv_segment_ids: Any, bias: Any,
        causal: bool, softmax_scale: float, sliding_window: Any, logits_soft_cap: Any, cfg: Any,
        precision: Any = "default") -> tuple[Any, Any]:
    """The reference as a kernel that saves the flash residuals (base-2 lse, +inf for rows that see nothing);
    it computes at full precision, so it takes ``precision`` (float32 calls default to ``"highest"``)."""
    out, lse = reference_flash_attention_lse(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                             sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                                             q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, bias=bias)
    lse2 = jnp.where(jnp.isneginf(lse), jnp.inf, lse / math.log(2.0))
    return out, (q, k, v, q_segment_ids, kv_segment_ids, bias, out, lse2)


def bwd(residuals: Any, d_out: jax.Array, *, d_lse: jax.Array | None = None, cfg: Any, precision: Any = "default",
        **static: Any) -> Any:
    """The reference's gradients, through the lse too when its cotangent comes."""
    q, k, v, q_seg, kv_seg, bias, _, lse2 = residuals

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        return reference_flash_attention_lse(q, k, v, **_static(q_seg, kv_seg, bias, **static))

    _, pullback = jax.vjp(f, q, k, v)
    dq, dk, dv = pullback((d_out, jnp.zeros(lse2.shape, jnp.float32) if d_lse is None else d_lse))
    return dq, dk, dv, None, None, None


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


def _flash(name: str, priority: int = 0, **vjp: Any) -> Any:
    return lambda register: register("flash_attention", "xla", "any", priority, name=name, vjp=ejk.VJP(
        fwd=fwd, residuals=FLASH_RESIDUALS, **vjp))(without_residuals(fwd))


@pytest.fixture
def host() -> PluginHost:
    return ejk.plugins.get_plugin_host()  # the private, empty host of conftest


def _inputs() -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(0)  # Sq > Sk, causal: the first rows see no key
    return tuple(jnp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in ((1, 10, 4, 8), (1, 6, 2, 8),
                                                                             (1, 6, 2, 8)))


def _runner(kernel: FlashAttentionLseKernel, tmp_path: Path) -> Any:
    executor = ejk.Executor(ejk.ConfigSelectorChain(persistent_dir=tmp_path))

    def run(q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        arrays, static = kernel.normalize(q, k, v, causal=True, softmax_scale=0.25)
        return executor(kernel, *arrays, platform="auto", **static)

    return run


def test_an_implementation_that_saves_the_lse_provides_the_variant(host: PluginHost, tmp_path: Path) -> None:
    host.register_plugin(_plugin("flash", _flash("ref", bwd=bwd, extra_cotangents=("lse",))), "flash")
    kernel = FlashAttentionLseKernel(host.registry)
    (spec,) = kernel.implementations()
    assert (spec.algorithm, spec.label, spec.vjp is not None and spec.vjp.paired) == ("flash_attention_lse",
                                                                                      "xla/any:ref", False)
    q, k, v = _inputs()
    run = _runner(kernel, tmp_path)
    (out, lse), (want, want_lse) = run(q, k, v), reference_flash_attention_lse(q, k, v, **_static(None, None, None,
                                                                                                   **OPTIONS))
    assert np.isneginf(np.asarray(lse[:, :, :4])).all() and not np.asarray(out[:, :4]).any()
    assert_close(out, want, jnp.float32)
    assert_close(jnp.where(jnp.isneginf(want_lse), 0.0, lse), jnp.where(jnp.isneginf(want_lse), 0.0, want_lse),
                 jnp.float32)

    def loss(fn: Any) -> Any:
        def total(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            out, lse = fn(q, k, v)
            return jnp.sum(out * out) + jnp.sum(jnp.where(jnp.isfinite(lse), lse * lse, 0.0))
        return total

    got = jax.grad(loss(run), argnums=(0, 1, 2))(q, k, v)
    ref = jax.grad(loss(lambda q, k, v: reference_flash_attention_lse(q, k, v, **_static(None, None, None, **OPTIONS))),
                   argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, ref, strict=True):
        assert_close(g, w, jnp.float32, what=f"d{name}")
    # A NaN lse cotangent on the rows that see no key gives them no gradient (the core masks it).
    (_, lse), pullback = jax.vjp(run, q, k, v)
    dq, *_ = pullback((jnp.zeros_like(out), jnp.where(jnp.isfinite(lse), 1.0, jnp.nan)))
    assert np.isfinite(np.asarray(dq)).all() and not np.asarray(dq[:, :4]).any()


def test_a_registration_for_the_variant_shadows_the_derived_one(host: PluginHost) -> None:
    def explicit(q: Any, k: Any, v: Any, **_: Any) -> Any:
        raise AssertionError("not called")

    host.register_plugin(_plugin("flash", lambda register: (
        _flash("ref", bwd=bwd, extra_cotangents=("lse",))(register),
        _flash("other", priority=-1, bwd=bwd, extra_cotangents=("lse",))(register),
        register("flash_attention_lse", "xla", "any", name="ref")(explicit))), "flash")
    found = FlashAttentionLseKernel(host.registry).implementations()
    assert [(s.name, s.implementation is explicit) for s in found] == [("ref", True), ("other", False)]


def test_a_backward_without_the_lse_cotangent_gives_a_forward_only_variant(host: PluginHost) -> None:
    host.register_plugin(_plugin("plain", _flash("plain", priority=5, bwd=bwd)), "plain")
    kernel = FlashAttentionLseKernel(host.registry)
    (plain,) = kernel.implementations()
    assert plain.vjp is not None and plain.vjp.paired
    q, k, v = _inputs()
    arrays, static = kernel.normalize(q, k, v, causal=True)
    call = {**dict(zip(kernel.array_names, arrays, strict=True)), **static}
    assert "no installed backward pairs" in (plain.capability(**call) or "")  # type: ignore[misc]
    host.register_plugin(_plugin("full", _flash("full", bwd=bwd, extra_cotangents=("lse",))), "full")
    (plain, _) = kernel.implementations()
    assert plain.capability(**call) is None  # type: ignore[misc]
    assert kernel.paired_backward(plain, call).label == "xla/any:full"


def test_extra_cotangents_need_a_backward() -> None:
    with pytest.raises(ValueError, match="pass bwd too"):
        ejk.VJP(fwd=fwd, residuals=FLASH_RESIDUALS, extra_cotangents=("lse",))
    with pytest.raises(ValueError, match="output names"):
        ejk.VJP(fwd=fwd, bwd=bwd, residuals=FLASH_RESIDUALS, extra_cotangents="lse")  # type: ignore[arg-type]


def test_ejk_kernels_lists_the_derived_implementations(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    host.register_plugin(_plugin("flash", _flash("ref", bwd=bwd, extra_cotangents=("lse",))), "flash")
    assert cli.main(["kernels", "--json"]) == 0
    rows = {(r["algorithm"], r["name"], r["derived"]) for r in json.loads(capsys.readouterr().out)}
    assert {("flash_attention", "ref", False), ("flash_attention_lse", "ref", True)} <= rows
    assert cli.main(["kernels", "flash_attention_lse"]) == 0
    assert "ref (from flash_attention)" in capsys.readouterr().out
