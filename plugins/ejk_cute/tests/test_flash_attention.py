"""cute/gpu:fa3 on any machine: gate, configs, registration and the pairing with another backward."""

from __future__ import annotations

import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import AttentionCase, assert_close, reference_flash_attention
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
    monkeypatch.setattr(_status, "runtime_reason", lambda: None)
    monkeypatch.setattr(fa, "paired_backward", lambda *args, **kwargs: object())  # a backward is installed
    assert fa.capability(*_qkv(d=64, sq=1, sk=1, hq=8, hkv=1), causal=True) is None
    assert fa.lse_capability(*_qkv(d=64, sq=1, sk=1, hq=8, hkv=1), causal=True) is None
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
    assert fa.config_space(*_qkv(d=96)) == []


# -- registration ---------------------------------------------------------------------------------------


def test_registered_for_both_attention_ops() -> None:
    for op, tag in (("flash_attention", fa.RESIDUALS), ("flash_attention_lse", fa.LSE_RESIDUALS)):
        (spec,) = [s for s in ejk.kernel_registry.list_implementations(op) if str(s.platform) == "cute"]
        assert spec.label == "cute/gpu:fa3"
        assert spec.cfg_type is fa.FlashAttentionConfig and spec.priority == fa.PRIORITY
        assert spec.vjp is not None and spec.vjp.residuals == tag


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
    (out, lse), _ = fa.lse_forward_with_residuals(q, q[:, :0], q[:, :0], causal=False, softmax_scale=0.125,
                                                  sliding_window=None, logits_soft_cap=None, **none)
    assert not np.asarray(out, np.float32).any() and np.all(np.asarray(lse) == -np.inf)


# -- pairing with another implementation's backward -------------------------------------------------


@attrs.frozen
class _Spec:
    platform: str
    label: str
    priority: int
    vjp: Any
    capability: Any = None
    backend: ejk.Backend = ejk.Backend.ANY


class _Registry:
    def __init__(self, specs: list[_Spec], unavailable: tuple[str, ...] = ()) -> None:
        self.specs, self.unavailable = specs, unavailable

    def list_implementations(self, op: str) -> list[_Spec]:
        return sorted(self.specs, key=lambda s: -s.priority)

    def spec_available(self, spec: _Spec) -> tuple[bool, str | None]:
        return (False, "no GPU") if spec.platform in self.unavailable else (True, None)


def _vjp(tag: str) -> ejk.VJP:
    return ejk.VJP(fwd=lambda *a, **k: None, bwd=lambda *a, **k: None, residuals=tag)


STATIC = dict(causal=True, softmax_scale=0.1, sliding_window=None, logits_soft_cap=None)


def test_pairing_picks_the_best_backward_with_the_same_residuals() -> None:
    residuals = (*_qkv(), None, None, None, None, None)
    specs = [
        _Spec("cute", "cute/gpu:fa3", 8, _vjp(fa.RESIDUALS)),
        _Spec("xla", "xla/gpu:cudnn", 10, _vjp("flash_attention:other")),
        _Spec("pallas", "pallas/gpu:flash", 6, _vjp(fa.RESIDUALS), capability=lambda **c: "too big"),
        _Spec("triton", "triton/gpu:flash", 5, _vjp(fa.RESIDUALS)),
        _Spec("slow", "slow/any:flash", 1, _vjp(fa.RESIDUALS)),
    ]
    chosen = fa.paired_backward("flash_attention", fa.RESIDUALS, residuals, STATIC, registry=_Registry(specs))
    assert chosen.label == "triton/gpu:flash"
    # An unavailable platform (an interpreter on a CPU) is taken only when no available one passes.
    chosen = fa.paired_backward("flash_attention", fa.RESIDUALS, residuals, STATIC,
                                registry=_Registry(specs, unavailable=("triton",)))
    assert chosen.label == "slow/any:flash"
    chosen = fa.paired_backward("flash_attention", fa.RESIDUALS, residuals, STATIC,
                                registry=_Registry(specs[:4], unavailable=("triton",)))
    assert chosen.label == "triton/gpu:flash"


def test_gate_refuses_where_no_backward_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a backward to pair with, gradients would fail at ``jax.grad``: the gate refuses instead,
    so ``platform="auto"`` takes an implementation whose gradients work; it names what to install."""
    monkeypatch.setattr(_status, "runtime_reason", lambda: None)
    asked = []

    def no_backward(op: str, tag: str, *args: Any, **kwargs: Any) -> Any:
        asked.append((op, tag))
        raise NotImplementedError("none is installed ... Install ejk-triton")

    monkeypatch.setattr(fa, "paired_backward", no_backward)
    for gate in (fa.capability, fa.lse_capability):
        reason = gate(*_qkv(), causal=True)
        assert reason is not None and "no installed backward" in reason and "ejk-triton" in reason
    assert asked == [("flash_attention", fa.RESIDUALS), ("flash_attention_lse", fa.LSE_RESIDUALS)]


def test_pairing_without_a_backward_says_what_to_install() -> None:
    residuals = (*_qkv(), None, None, None, None, None)
    specs = [_Spec("cute", "cute/gpu:fa3", 8, _vjp(fa.RESIDUALS)),
             _Spec("pallas", "pallas/gpu:flash", 6, _vjp(fa.RESIDUALS), capability=lambda **c: "too big")]
    with pytest.raises(NotImplementedError, match=r"no backward of its own.*pallas/gpu:flash: too big.*ejk-triton"):
        fa.paired_backward("flash_attention", fa.RESIDUALS, residuals, STATIC, registry=_Registry(specs))
    with pytest.raises(NotImplementedError, match="none is installed"):
        fa.paired_backward("flash_attention", fa.RESIDUALS, residuals, STATIC, registry=_Registry(specs[:1]))


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


@pytest.mark.parametrize("causal", [False, True])
def test_backward_runs_the_paired_implementation_on_our_residuals(causal: bool) -> None:
    """Residuals in this kernel's format (reference output, base-2 lse) through ``backward``: the
    gradients equal the reference's. Needs another installed backward that runs here (ejk-triton in
    its interpreter mode, ejk-pallas in its)."""
    case = AttentionCase(b=1, sq=12, sk=16, hq=4, hkv=2, d=16, causal=causal, dtype="float32")
    x = case.inputs()
    q, k, v = x["q"], x["k"], x["v"]
    scale = 0.25
    static = dict(causal=causal, softmax_scale=scale, sliding_window=None, logits_soft_cap=None)
    try:
        spec = fa.paired_backward("flash_attention", fa.RESIDUALS, (q, k, v), static)
    except NotImplementedError as exc:
        pytest.skip(str(exc))

    def ref(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return reference_flash_attention(q, k, v, causal=causal, softmax_scale=scale)

    out, pullback = jax.vjp(ref, q, k, v)
    d_out = case.cotangent()
    residuals = (q, k, v, None, None, None, out, _lse2_reference(q, k, causal, scale))
    grads = fa.backward(residuals, d_out, **static)
    assert len(grads) == 6 and grads[3:] == (None, None, None)
    for name, got, want in zip("qkv", grads[:3], pullback(d_out), strict=True):
        assert_close(got, want, jnp.float32, what=f"d{name} via {spec.label}")
