"""cute/gpu:fa3 on any machine: gate, configs, registration and the pairing with another backward."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.ops import FLASH_LSE_RESIDUALS, with_natural_lse
from ejk.testing import AttentionCase, assert_close, reference_flash_attention, reference_flash_attention_lse
from ejk_cute import _flash_attention as fa
from ejk_cute import _status

S = jax.ShapeDtypeStruct


def _qkv(b: int = 1, sq: int = 256, sk: int = 256, hq: int = 4, hkv: int = 2, d: int = 128,
         dtype: Any = jnp.bfloat16, dv: int | None = None) -> tuple[S, S, S]:
    return S((b, sq, hq, d), dtype), S((b, sk, hkv, d), dtype), S((b, sk, hkv, dv or d), dtype)


# -- capability gate ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "options", "why"), [
    (dict(dtype=jnp.float32), {}, "float32 not supported"),
    (dict(d=96), {}, "head dims q/k 96, v 96 not supported"),
    (dict(d=256), {}, "not supported"),
    (dict(dv=64), {}, "v 64 not supported"),
    ({}, dict(q_segment_ids=S((1, 256), jnp.int32), kv_segment_ids=S((1, 256), jnp.int32)), "segment ids"),
    ({}, dict(bias=S((1, 1, 256, 256), jnp.float32)), "bias not supported"),
    (dict(hq=70000, hkv=1), {}, "grid limit"),
])
def test_gate_refuses_what_the_kernel_was_not_built_for(kwargs: dict[str, Any], options: dict[str, Any],
                                                          why: str) -> None:
    q, k, v = _qkv(**kwargs)
    reason = fa.capability(q, k, v, **options)
    assert reason is not None and why in reason, reason


def test_gate_refuses_mixed_dtypes() -> None:
    q, k, v = _qkv()
    reason = fa.capability(q, S(k.shape, jnp.float16), v)
    assert reason is not None and "share one dtype" in reason


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gate_on_this_machine(d: int, dtype: Any) -> None:
    """Supported calls pass the argument checks; what remains is the platform's reason (CUTLASS, sm_90+)."""
    q, k, v = _qkv(d=d, dtype=dtype, sq=1, sk=77, hq=8, hkv=1)
    reason = fa.capability(q, k, v, causal=True, sliding_window=(5, 0), logits_soft_cap=30.0)
    assert reason == _status.runtime_reason()
    if jax.default_backend() == "cpu":
        assert reason is not None and ("9.0" in reason or "nvidia-cutlass-dsl" in reason)


def test_gate_passes_supported_calls_where_the_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's own gate (the registered one also asks the core whether a backward pairs: below)."""
    monkeypatch.setattr(_status, "runtime_reason", lambda: None)
    assert fa.capability(*_qkv(d=64, sq=1, sk=1, hq=8, hkv=1), causal=True) is None
    assert fa.capability(*_qkv(dtype=jnp.float16)) is None  # float16: verified on the H100 (2026-11-23)
    monkeypatch.setattr(_status, "runtime_reason", lambda: "needs sm_90+ (Hopper or newer): this GPU is sm_80")
    assert fa.capability(*_qkv()) == "needs sm_90+ (Hopper or newer): this GPU is sm_80"


# -- configs --------------------------------------------------------------------------------------------


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="block_kv must be a multiple of 16"):
        fa.FlashAttentionConfig(block_kv=100)
    with pytest.raises(ValueError, match="block_kv"):
        fa.FlashAttentionConfig(block_kv=272)
    with pytest.raises(ValueError, match="stages"):
        fa.FlashAttentionConfig(stages=1)
    with pytest.raises(ValueError, match="block_q"):
        fa.FlashAttentionConfig(block_q=64)
    with pytest.raises(TypeError, match="pingpong"):
        fa.FlashAttentionConfig(pingpong=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_config_space_fits_shared_memory_and_starts_with_the_heuristic(d: int) -> None:
    q, k, v = _qkv(d=d)
    space = fa.config_space(q, k, v, None, None, None, causal=True)
    assert space and len(set(space)) == len(space)
    assert space[0] == fa.heuristic_config(q, k, v, None, None, None, causal=True)
    assert all(fa.smem_bytes(c, d) <= fa.SMEM_LIMIT for c in space)
    assert all(c.block_kv % 16 == 0 and c.block_q == fa.BLOCK_Q for c in space)


def test_smem_estimate_prunes_deep_pipelines() -> None:
    assert fa.smem_bytes(fa.FlashAttentionConfig(block_kv=128, stages=3), 128) <= fa.SMEM_LIMIT
    assert fa.smem_bytes(fa.FlashAttentionConfig(block_kv=128, stages=4), 128) > fa.SMEM_LIMIT
    # A persistent grid holds two Q stages: at D = 128 three K/V stages no longer fit beside them.
    assert fa.smem_bytes(fa.FlashAttentionConfig(block_kv=128, stages=2, persistent=True), 128) <= fa.SMEM_LIMIT
    assert fa.smem_bytes(fa.FlashAttentionConfig(block_kv=128, stages=3, persistent=True), 128) > fa.SMEM_LIMIT


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_heuristic_runs_the_persistent_grid(d: int) -> None:
    q, k, v = _qkv(d=d)
    cfg = fa.heuristic_config(q, k, v, None, None, None, causal=True)
    assert cfg.persistent and cfg.block_kv == 128 and cfg.stages == (2 if d == 128 else 3)
    assert fa.config_space(*_qkv(d=96)) == []


# -- registration ---------------------------------------------------------------------------------------


def test_registered_forward_only_for_both_attention_ops() -> None:
    for op, tag in (("flash_attention", fa.RESIDUALS), ("flash_attention_lse", FLASH_LSE_RESIDUALS)):
        (spec,) = [s for s in ejk.ops.get_op(op).kernel.implementations() if str(s.platform) == "cute"]
        assert spec.label == "cute/gpu:fa3"
        assert spec.cfg_type is fa.FlashAttentionConfig and spec.priority == fa.PRIORITY
        assert spec.vjp is not None and spec.vjp.residuals == tag
        assert spec.vjp.paired and spec.vjp.fix == fa.PAIRING_FIX  # the core runs another's backward
        assert spec.capability is not fa.capability and spec.capability.__wrapped__ is fa.capability


def test_residual_tag_matches_the_other_flash_attentions() -> None:
    """The pairing contract: ejk-triton and ejk-pallas save the same residuals under the same tag."""
    tags = {str(s.platform): s.vjp.residuals for s in ejk.kernel_registry.list_implementations("flash_attention")
            if s.vjp is not None and str(s.platform) in ("triton", "pallas")}
    if not tags:
        pytest.skip("neither ejk-triton nor ejk-pallas is installed")
    assert set(tags.values()) == {fa.RESIDUALS}


def test_forward_refuses_what_the_gate_refuses() -> None:
    q = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="no segment ids or bias"):
        fa.forward(q, q, q, causal=False, softmax_scale=0.125, sliding_window=None, logits_soft_cap=None,
                   q_segment_ids=None, kv_segment_ids=None, bias=jnp.zeros((1, 1, 8, 8), jnp.float32))


def test_empty_problems_need_no_launch() -> None:
    q = jnp.zeros((2, 0, 4, 64), jnp.bfloat16)
    k = jnp.zeros((2, 5, 2, 64), jnp.bfloat16)
    none = dict(q_segment_ids=None, kv_segment_ids=None, bias=None)
    out, res = fa.forward_with_residuals(q, k, k, causal=False, softmax_scale=0.125, sliding_window=None,
                                         logits_soft_cap=None, **none)
    assert out.shape == (2, 0, 4, 64) and res[-1].shape == (2, 4, 0)
    q = jnp.ones((1, 3, 2, 64), jnp.bfloat16)
    (out, lse), _ = with_natural_lse(fa.forward_with_residuals)(q, q[:, :0], q[:, :0], causal=False,
                                                                softmax_scale=0.125, sliding_window=None,
                                                                logits_soft_cap=None, **none)
    assert not np.asarray(out, np.float32).any() and np.all(np.asarray(lse) == -np.inf)


# -- pairing with another implementation's backward (the core's, through the registered gate) --------


OPS = (("flash_attention", fa.RESIDUALS), ("flash_attention_lse", FLASH_LSE_RESIDUALS))


def _registered(*partners: tuple[str, str, int, Any]) -> ejk.KernelRegistry:
    """A registry holding cute/gpu:fa3 and fake full implementations ``(op, name, priority, capability)``
    of the same residuals (portable, so they target this machine's backend)."""
    registry = ejk.KernelRegistry()
    fa.register_flash_attention(registry.register)
    for op, name, priority, gate in partners:
        tag = dict(OPS)[op]
        registry.register(op, "fake", "any", priority, name=name, capability=gate,
                          vjp=ejk.VJP(fwd=lambda *a, **k: None, bwd=lambda *a, **k: None, residuals=tag))(
            lambda *a, **k: None)
    return registry


def _gate(registry: ejk.KernelRegistry, op: str) -> Any:
    """The registered gate, called as the core calls it: with the call's keyword view."""
    (spec,) = [s for s in type(ejk.ops.get_op(op).kernel)(registry).implementations() if str(s.platform) == "cute"]
    return lambda q, k, v, **options: spec.capability(q=q, k=k, v=v, **options)


def test_gate_refuses_where_no_backward_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a backward to pair with, gradients would fail at ``jax.grad``: the gate refuses instead,
    so ``platform="auto"`` takes an implementation whose gradients work; it names what to install."""
    monkeypatch.setattr(_status, "runtime_reason", lambda: None)
    for op, tag in OPS:
        reason = _gate(_registered(), op)(*_qkv(), causal=True)
        assert reason is not None and reason.startswith("no installed backward pairs with it for gradients")
        assert "cute/gpu:fa3 has no backward of its own" in reason and repr(tag) in reason
        assert "none is installed" in reason and reason.endswith(f"{fa.PAIRING_FIX})")
        too_big = _registered((op, "flash", 6, lambda **c: "too big"))
        reason = _gate(too_big, op)(*_qkv(), causal=True)
        assert reason is not None and "fake/any:flash: too big" in reason and "ejk-triton" in reason
        assert _gate(_registered((op, "flash", 6, None)), op)(*_qkv(), causal=True) is None
    # the plugin's own reasons come first
    assert _gate(_registered(), "flash_attention")(*_qkv(d=96)) == fa.capability(*_qkv(d=96))


def _lse2_reference(q: jax.Array, k: jax.Array, causal: bool, scale: float) -> jax.Array:
    """The base-2 log-sum-exp the kernel saves, from the materialised logits."""
    group = q.shape[2] // k.shape[2]
    kk = jnp.repeat(k, group, axis=2).astype(jnp.float32)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), kk) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        visible = jnp.arange(sk)[None, :] <= jnp.arange(sq)[:, None] + (sk - sq)
        logits = jnp.where(visible, logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.where(jnp.isneginf(lse), jnp.inf, lse / math.log(2.0))


def _reference_launch(cfg: Any, static: dict[str, Any], q: jax.Array, k: jax.Array,
                      v: jax.Array, sinks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The kernel's outputs from the reference (so the forward runs on a CPU): out, base-2 lse
    (``sinks`` ``[B, Hq]``, read when ``static["sinks"]``, as the kernel does)."""
    causal, scale = static["causal"], static["softmax_scale"]
    if static.get("sinks"):
        out, lse = reference_flash_attention_lse(q, k, v, causal=causal, softmax_scale=scale, sinks=sinks[0])
        return out.astype(q.dtype), jnp.where(jnp.isneginf(lse), jnp.inf, lse / math.log(2.0))
    out = reference_flash_attention(q, k, v, causal=causal, softmax_scale=scale)
    return out.astype(q.dtype), _lse2_reference(q, k, causal, scale)


def _on_this_machine(op: str) -> Any:
    """``op``'s kernel over a registry where cute/gpu:fa3 is registered for this machine's backend
    (``Backend.CPU``; its forward is the reference, see :func:`_reference_launch`) beside the installed
    implementations of the op, so the core's whole path runs here."""
    registry = ejk.KernelRegistry()

    def here(algorithm: str, platform: Any, backend: Any, **options: Any) -> Any:
        return registry.register(algorithm, platform, jax.default_backend(), **options)

    fa.register_flash_attention(here)
    ops = dict.fromkeys((op, "flash_attention"))  # flash_attention's too: flash_attention_lse derives from them
    for spec in [s for name in ops for s in ejk.kernel_registry.list_implementations(name)]:
        if str(spec.platform) != "cute":
            registry.register(spec.algorithm, spec.platform, spec.backend, spec.priority, name=spec.name,
                              cfg_type=spec.cfg_type, config_space=spec.config_space, heuristic=spec.heuristic,
                              capability=spec.capability, rank=spec.rank, vjp=spec.vjp)(spec.implementation)
    return type(ejk.ops.get_op(op).kernel)(registry)


@pytest.mark.parametrize("op", [op for op, _ in OPS])
@pytest.mark.parametrize(("causal", "with_sinks"), [(False, False), (True, False), (True, True)],
                         ids=["full", "causal", "causal-sinks"])
def test_gradients_run_the_paired_backward_on_our_residuals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                            op: str, causal: bool, with_sinks: bool) -> None:
    """``jax.grad`` through platform ``cute``: the forward's residuals (the kernel's outputs, from the
    reference here) go to another installed implementation's backward, which the core picks; the
    gradients equal the reference's (with sinks: the sinks' too, the backward taking them from the
    residuals). Needs one that runs here (ejk-triton or ejk-pallas in their interpreter modes)."""
    monkeypatch.setattr(_status, "runtime_reason", lambda: None)
    monkeypatch.setattr(fa, "_launch", _reference_launch)
    kernel = _on_this_machine(op)
    case = AttentionCase(b=1, sq=12, sk=16, hq=4, hkv=2, d=64, causal=causal, dtype="bfloat16")
    x = case.inputs()
    q, k, v = x["q"], x["k"], x["v"]
    sinks = jnp.asarray([0.5, -1.0, 2.0, 0.0], jnp.float32) if with_sinks else None
    executor = ejk.Executor(ejk.ConfigSelectorChain(persistent_dir=tmp_path))
    try:  # a forced platform whose gate refuses raises, naming the reason
        found = ejk.explain(kernel, q, k, v, causal=causal, softmax_scale=0.125, sinks=sinks, platform="cute",
                            executor=executor)
    except ValueError as exc:
        assert "no installed backward pairs" in str(exc)
        pytest.skip(str(exc))
    (report,) = [r for r in found.implementations if str(r.label).startswith("cute/")]
    assert report.status == "chosen"
    assert report.backward is not None and report.backward.startswith(f"paired by residuals {dict(OPS)[op]!r}: ")

    def public(q: jax.Array, k: jax.Array, v: jax.Array, s: Any) -> Any:  # what ejk.<op>(..., platform="cute") runs
        arrays, static = kernel.normalize(q, k, v, causal=causal, softmax_scale=0.125, sinks=s)
        return executor(kernel, *arrays, platform="cute", **static)

    def reference(q: jax.Array, k: jax.Array, v: jax.Array, s: Any) -> Any:
        fn = reference_flash_attention if op == "flash_attention" else reference_flash_attention_lse
        return fn(q, k, v, causal=causal, softmax_scale=0.125, sinks=s)

    def grads(fn: Any, *args: Any) -> Any:
        def loss(q: jax.Array, k: jax.Array, v: jax.Array, s: Any) -> jax.Array:
            out = fn(q, k, v, s)
            out, lse = out if isinstance(out, tuple) else (out, None)
            total = jnp.sum(out.astype(jnp.float32) * case.cotangent().astype(jnp.float32))
            return total if lse is None else total + 0.5 * jnp.sum(lse)  # every row sees a key: lse is finite
        return jax.grad(loss, argnums=(0, 1, 2, 3) if with_sinks else (0, 1, 2))(*args)

    got = grads(public, q, k, v, sinks)
    want = grads(reference, *(t.astype(jnp.float32) for t in (q, k, v)), sinks)
    for name, g, w in zip(("q", "k", "v", "sinks"), got, want, strict=False):
        assert_close(g, w, jnp.bfloat16, what=f"d{name} of {op} via {report.backward}")
