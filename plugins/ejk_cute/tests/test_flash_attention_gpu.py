"""cute/gpu:fa3 on a Hopper GPU: outputs and log-sum-exp against the materialised reference, every
config, masks and edge cases, and gradients through the public op (the forward paired with another
implementation's backward)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.ops import ImplChoice, with_natural_lse, without_residuals
from ejk.testing import (
    AttentionCase,
    assert_close,
    attention_values_and_grads,
    check_flash_attention,
    check_flash_attention_sinks,
    reference_flash_attention,
    reference_flash_attention_lse,
)
from ejk_cute import _flash_attention as fa
from ejk_cute import _status

REASON = _status.runtime_reason()
#: The kernel's ``flash_attention_lse`` forward (the core derives it from the residuals' base-2 lse).
FORWARD_LSE = without_residuals(with_natural_lse(fa.forward_with_residuals), "forward_lse")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]

#: (b, sq, hq, sk, hkv, d) and options, as ejk.testing's conformance cases.
CASES: tuple[dict[str, Any], ...] = (
    {"shape": (2, 256, 4, 256, 4, 128)},
    {"shape": (1, 300, 8, 333, 2, 128), "causal": True},  # Sk not a block multiple, Sq != Sk, GQA 4
    {"shape": (1, 1, 8, 333, 1, 64), "causal": True},  # decode-like: Sq = 1, MQA (GQA 8)
    {"shape": (2, 190, 4, 257, 2, 64), "sliding_window": (70, 20)},
    {"shape": (1, 200, 2, 100, 1, 128), "causal": True},  # Sq > Sk: the leading rows see nothing
    {"shape": (1, 129, 8, 300, 8, 64), "logits_soft_cap": 30.0},
    {"shape": (1, 500, 4, 640, 2, 128), "causal": True, "sliding_window": (100, 0), "logits_soft_cap": 20.0},
    {"shape": (1, 64, 2, 1, 2, 64)},  # Sk = 1
    {"shape": (1, 77, 6, 200, 2, 64), "causal": True},  # GQA 3: not packed (3 does not divide 64 rows)
    {"shape": (2, 33, 32, 300, 1, 128), "causal": True, "sliding_window": (50, 0)},  # 32 heads packed in a tile
)


def test_conformance() -> None:
    """Values and dq, dk, dv (the paired backward) through ``ejk.flash_attention(platform="cute")``
    against the reference, bfloat16 (passed on the H100, 2026-11-23)."""
    assert check_flash_attention("cute", dtypes=(jnp.bfloat16,), cases=CASES, grads=True) == len(CASES)


#: Sinks (gpt-oss: head dim 64, causal, window 128, GQA 8 packed; GQA 4 at head dim 128; rows that see nothing).
SINK_CASES: tuple[dict[str, Any], ...] = (
    {"shape": (2, 384, 16, 384, 2, 64), "causal": True, "sliding_window": (128, 0), "sink_scale": 2.0},
    {"shape": (1, 300, 8, 333, 2, 128), "causal": True},
    {"shape": (1, 200, 2, 100, 1, 128), "causal": True, "sink_scale": 4.0},
)


def test_sinks_conformance() -> None:
    """Values and gradients (the sinks' included, from the paired backward) with sinks, and the lse
    (which includes them), bfloat16."""
    assert check_flash_attention_sinks("cute", dtypes=(jnp.bfloat16,), cases=SINK_CASES) == len(SINK_CASES)
    assert check_flash_attention_sinks("cute", dtypes=(jnp.bfloat16,), cases=SINK_CASES[:1], lse=True) == 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c))
def test_float16_conformance(case: dict[str, Any]) -> None:
    """float16 through the public op, values and paired gradients, one case per test (each compiles
    its own kernels: apart, a slow case is named rather than timing out the whole list)."""
    assert check_flash_attention("cute", dtypes=(jnp.float16,), cases=(case,), grads=True) == 1


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: str(c["shape"]))
def test_float16_kernel_directly(case: dict[str, Any]) -> None:
    """The float16 kernel itself, forward (passed on the H100, 2026-11-23, all three cases; the
    first float16 run had put every case into one test, which did not finish in its time limit)."""
    q, k, v = _inputs(*case["shape"], jnp.float16)
    options = {"causal": case.get("causal", False), "sliding_window": case.get("sliding_window"),
               "logits_soft_cap": case.get("logits_soft_cap")}
    got = jax.jit(functools.partial(fa.forward, softmax_scale=q.shape[3] ** -0.5, q_segment_ids=None,
                                    kv_segment_ids=None, bias=None, **options))(q, k, v)
    want = reference_flash_attention(q, k, v, **options)
    assert_close(got, want, jnp.float16, what="float16 out")


def _inputs(b: int, sq: int, hq: int, sk: int, hkv: int, d: int, dtype: Any, seed: int = 0) -> tuple[jax.Array, ...]:
    case = AttentionCase(b=b, sq=sq, sk=sk, hq=hq, hkv=hkv, d=d, dtype=jnp.dtype(dtype).name)
    x = case.inputs(seed)
    return x["q"], x["k"], x["v"]


def _check_lse(q: jax.Array, k: jax.Array, v: jax.Array, cfg: fa.FlashAttentionConfig, **options: Any) -> None:
    static = dict(causal=False, sliding_window=None, logits_soft_cap=None) | options
    scale = q.shape[3] ** -0.5
    window = static["sliding_window"]
    if window is not None and static["causal"]:
        window = (window[0], 0)
    static_op = static | {"sliding_window": window}
    run = jax.jit(functools.partial(FORWARD_LSE, cfg=cfg, softmax_scale=scale, q_segment_ids=None,
                                    kv_segment_ids=None, bias=None, **static_op))
    out, lse = run(q, k, v)
    want_out, want_lse = reference_flash_attention_lse(q, k, v, softmax_scale=scale, **static)
    assert_close(out, want_out, q.dtype, what=f"out {cfg}", strict=True)
    want = np.asarray(want_lse)
    got = np.asarray(lse)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg="rows that see no key")
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], atol=2e-2, rtol=2e-3, err_msg=f"lse {cfg}")


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_every_config_with_masks(d: int) -> None:
    q, k, v = _inputs(2, 333, 4, 517, 2, d, jnp.bfloat16)
    for cfg in [*fa.config_space(q, k, v), fa.FlashAttentionConfig(pingpong=False)]:
        _check_lse(q, k, v, cfg, causal=True)
    _check_lse(q, k, v, fa.heuristic_config(q, k, v), sliding_window=(150, 40))


@pytest.mark.parametrize("d", fa.HEAD_DIMS)
def test_persistent_grid_walks_many_items(d: int) -> None:
    """More work items than SMs (8 x 16 query tiles x 16 heads at most 2048): each persistent CTA walks
    a snake of them, its K / V pipelines and Q stages running on across items. Ragged lengths, GQA 4,
    causal (unequal items), a window, and no mask."""
    q, k, v = _inputs(8, 1000, 16, 1100, 4, d, jnp.bfloat16, seed=d)
    cfg = next(c for c in fa.config_space(q, k, v) if c.persistent)
    assert fa._grid_ctas(cfg, 8, 1000, 16, 1100, True, None, fa.pack_of(16, 4)) < 8 * 32 * 4  # packed rows
    for options in (dict(causal=True), dict(sliding_window=(300, 50)), dict()):
        _check_lse(q, k, v, cfg, **options)


def test_rows_that_see_no_key_are_zeros_with_zero_gradients() -> None:
    q, k, v = _inputs(1, 300, 2, 100, 2, 64, jnp.bfloat16)
    out = jax.jit(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True, platform="cute"))(q, k, v)
    assert not np.asarray(out[:, :200], np.float32).any()
    assert np.isfinite(np.asarray(out, np.float32)).all()
    grads = jax.jit(jax.grad(lambda q, k, v: ejk.flash_attention(q, k, v, causal=True, platform="cute")
                             .astype(jnp.float32).sum(), argnums=(0, 1, 2)))(q, k, v)
    assert not np.asarray(grads[0][:, :200], np.float32).any()
    assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads)


@pytest.mark.parametrize("group", [1, 2, 8])
def test_realistic_size_against_cudnn_layout_reference(group: int) -> None:
    q, k, v = _inputs(2, 1024, 16, 1024, 16 // group, 128, jnp.bfloat16, seed=group)
    for causal in (False, True):
        got = jax.jit(lambda q, k, v, c=causal: ejk.flash_attention(q, k, v, causal=c, platform="cute"))(q, k, v)
        want = reference_flash_attention(q, k, v, causal=causal)
        assert_close(got, want, jnp.bfloat16, what=f"out group {group} causal {causal}")


def test_explicit_pairing_with_the_triton_backward() -> None:
    """An ImplChoice naming the backward: cute's forward, Triton's backward, the reference's gradients."""
    pytest.importorskip("ejk_triton")
    case = AttentionCase(b=1, sq=384, sk=384, hq=4, hkv=2, d=128, causal=True, dtype="bfloat16")
    choice = ImplChoice(platform="cute", backend="gpu", implementation="fa3", cfg=fa.FlashAttentionConfig(),
                        backward=ImplChoice(platform="triton", backend="gpu", implementation="flash"))

    def ours(q: jax.Array, k: jax.Array, v: jax.Array, **_: Any) -> jax.Array:
        return ejk.flash_attention(q, k, v, causal=True, cfg=choice)

    def ref(q: jax.Array, k: jax.Array, v: jax.Array, **_: Any) -> jax.Array:
        return reference_flash_attention(q, k, v, causal=True)

    inputs, d_out = case.inputs(), case.cotangent()
    out, grads = attention_values_and_grads(ours, inputs, d_out, jit=jax.jit)
    want_out, want_grads = attention_values_and_grads(ref, inputs, d_out, jit=jax.jit)
    assert_close(out, want_out, jnp.bfloat16, what="out")
    for name in ("q", "k", "v"):
        assert_close(grads[name], want_grads[name], jnp.bfloat16, what=f"d{name}")


def test_vmap_folds_into_the_batch() -> None:
    q, k, v = _inputs(6, 200, 4, 300, 2, 64, jnp.bfloat16)
    fn = functools.partial(ejk.flash_attention, causal=True, platform="cute")
    got = jax.jit(jax.vmap(fn))(q.reshape(3, 2, *q.shape[1:]), k.reshape(3, 2, *k.shape[1:]),
                                v.reshape(3, 2, *v.shape[1:]))
    want = reference_flash_attention(q, k, v, causal=True)
    assert_close(got.reshape(want.shape), want, jnp.bfloat16, what="vmapped out")
