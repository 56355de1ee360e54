"""``ejk.flash_attention_lse`` on ejk-triton: the flash kernels' output and natural log-sum-exp.

Values and gradients through both outputs against ``ejk.testing.reference_flash_attention_lse``
(the interpreter on the CPU; compiled on an NVIDIA GPU), including rows that see no key
(``lse = -inf``, zero output, no gradient).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import FLASH_ATTENTION_CASES, assert_close, check_op, reference_flash_attention_lse
from ejk_triton import FlashAttentionConfig, _env

pytestmark = pytest.mark.skipif(not (_env.nvidia_gpu()[0] or _env.interpret_mode()),
                                reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")

SMALL = FlashAttentionConfig(block_m=16, block_n=16, bwd_block_m=16, bwd_block_n=16)

CASES = [  # (b, sq, sk, hq, hkv, d, dtype, options, segment ids)
    (2, 24, 40, 4, 2, 32, "float32", dict(causal=True), False),  # Sq < Sk, GQA 2
    (1, 20, 20, 2, 1, 16, "float32", dict(sliding_window=(3, 2), logits_soft_cap=3.0), True),  # masked rows
    (1, 12, 4, 2, 2, 16, "float32", dict(sliding_window=(0, 0)), False),  # rows 0-7 see no key
    (1, 33, 33, 4, 1, 64, "bfloat16", dict(causal=True), False),
]


def _loss(fn: Any, w_out: jax.Array, w_lse: jax.Array) -> Any:
    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out, lse = fn(q, k, v)
        return (out.astype(jnp.float32) * w_out).sum() + (jnp.where(jnp.isfinite(lse), lse, 0.0) * w_lse).sum()

    return loss


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"q{c[1]}k{c[2]}h{c[3]}/{c[4]}d{c[5]}-{c[6]}-{sorted(c[7])}")
def test_values_and_gradients_through_both_outputs(case: tuple[Any, ...]) -> None:
    b, sq, sk, hq, hkv, d, dtype, options, seg = case
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)

    q, k, v = normal(b, sq, hq, d), normal(b, sk, hkv, d), normal(b, sk, hkv, d)
    if seg:
        options = dict(options, q_segment_ids=jnp.asarray(rng.integers(0, 3, (b, sq)), jnp.int32),
                       kv_segment_ids=jnp.asarray(rng.integers(0, 2, (b, sk)), jnp.int32))
    w_out = jnp.asarray(rng.standard_normal((b, sq, hq, d), dtype=np.float32))
    w_lse = jnp.asarray(rng.standard_normal((b, hq, sq), dtype=np.float32))

    def ours(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        return ejk.flash_attention_lse(q, k, v, platform="triton", cfg=SMALL, **options)  # type: ignore[no-any-return]

    def ref(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        return reference_flash_attention_lse(q, k, v, **options)  # type: ignore[no-any-return]

    (out, lse), (want_out, want_lse) = jax.jit(ours)(q, k, v), jax.jit(ref)(q, k, v)
    assert lse.dtype == jnp.float32 and lse.shape == (b, hq, sq)
    assert np.array_equal(np.isfinite(np.asarray(lse)), np.isfinite(np.asarray(want_lse)))
    assert np.all(np.asarray(out, np.float32)[np.transpose(~np.isfinite(np.asarray(lse)), (0, 2, 1))] == 0.0)
    assert_close(out, want_out, dtype, what="out")
    finite = jnp.isfinite(want_lse)
    assert_close(jnp.where(finite, lse, 0.0), jnp.where(finite, want_lse, 0.0), dtype, what="lse")
    grads = jax.jit(jax.grad(_loss(ours, w_out, w_lse), (0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(_loss(ref, w_out, w_lse), (0, 1, 2)))(q, k, v)
    for name, got, expected in zip("qkv", grads, want, strict=True):
        assert_close(got, expected, dtype, what=f"d{name}")


def test_rows_that_see_no_key_get_no_gradient_from_a_nan_lse_cotangent() -> None:
    # Non-causal window (0, 0) with Sq = 12 > Sk = 4: rows 0-7 see no key.
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in ((1, 12, 2, 16), (1, 4, 2, 16),
                                                                              (1, 4, 2, 16)))

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        return ejk.flash_attention_lse(q, k, v, sliding_window=(0, 0), platform="triton", cfg=SMALL)  # type: ignore[no-any-return]

    (out, lse), pullback = jax.vjp(f, q, k, v)
    d_lse = jnp.where(jnp.isfinite(lse), 1.0, jnp.nan)  # NaN exactly on the rows that see nothing
    dq, dk, dv = pullback((jnp.ones_like(out), d_lse))
    assert np.all(~np.isfinite(np.asarray(lse[:, :, :8]))) and np.all(np.isfinite(np.asarray(lse[:, :, 8:])))
    for grad in (dq, dk, dv):
        assert np.isfinite(np.asarray(grad)).all()
    assert np.all(np.asarray(dq)[:, :8] == 0.0)


def test_lse_conformance_subset() -> None:
    # The lse conformance suite through ejk.flash_attention_lse(platform="triton"), derived from the flash
    # kernels' VJP: causal GQA, window + soft cap, segments and Sq > Sk (rows that see no key).
    cases = [FLASH_ATTENTION_CASES[i] for i in (1, 5, 7, 8)]
    assert check_op("flash_attention_lse", "triton", dtypes=(jnp.float32,), cases=cases, cfg=SMALL) == 4
