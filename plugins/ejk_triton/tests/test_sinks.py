"""Attention sinks and ``precision`` in the Triton kernels (interpreted on a CPU, compiled on a GPU): flash
attention and its lse variant (values and gradients, the sinks' included) and paged attention (one split,
split-K merged in the kernel or in JAX), against the float32 references."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import (
    SINKS_CASES,
    assert_close,
    check_flash_attention_sinks,
    paged_batch,
    reference_flash_attention,
    reference_ragged_paged_attention,
)
from ejk_triton import _env
from ejk_triton._flash_attention import FlashAttentionConfig
from ejk_triton._paged_attention import PagedAttentionConfig

needs_kernels = pytest.mark.skipif(not (_env.nvidia_gpu()[0] or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")
SMALL = FlashAttentionConfig(block_m=16, block_n=16, bwd_block_m=16, bwd_block_n=16)


@needs_kernels
def test_flash_attention_with_sinks() -> None:
    """GQA 4, causal window; then the lse variant with rows that see no key (Sq > Sk)."""
    assert check_flash_attention_sinks("triton", dtypes=(jnp.float32,), cases=[SINKS_CASES[2]], cfg=SMALL) == 1
    assert check_flash_attention_sinks("triton", dtypes=(jnp.bfloat16,), cases=[SINKS_CASES[4]], lse=True,
                                       cfg=SMALL) == 1


@needs_kernels
def test_float32_precision_is_honoured() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 16, 2, 16)), jnp.float32) for _ in range(3))
    want = reference_flash_attention(q, k, v, causal=True)
    for precision in ("highest", "high", "default"):  # IEEE, 3xTF32, TF32 (the interpreter is exact for all)
        got = ejk.flash_attention(q, k, v, causal=True, precision=precision, platform="triton", cfg=SMALL)
        assert_close(got, want, jnp.float32 if precision != "default" else jnp.bfloat16, what=precision)


@needs_kernels
@pytest.mark.parametrize("cfg", [PagedAttentionConfig(block_q=1, block_kv=16, num_splits=1),
                                 PagedAttentionConfig(block_q=4, block_kv=16, num_splits=2),
                                 PagedAttentionConfig(block_q=4, block_kv=16, num_splits=2, fused_merge=True)],
                         ids=["one-split", "jax-merge", "fused-merge"])
def test_paged_attention_with_sinks(cfg: PagedAttentionConfig) -> None:
    args = paged_batch(0, q_lens=[2, 3, 1], kv_lens=[10, 6, 3], num_seqs=2, pages_per_seq=4, spare_pages=4, hq=8,
                       hkv=2, d=16, dtype=jnp.float32)
    sinks = jnp.asarray(np.random.default_rng(1).standard_normal(8) * 2, jnp.float32)
    got = ejk.ragged_paged_attention(*args, sinks=sinks, sliding_window=3, platform="triton", cfg=cfg)
    assert_close(got, reference_ragged_paged_attention(*args, sinks=sinks, sliding_window=3), jnp.float32)


@pytest.mark.gpu
def test_gpt_oss_shape_with_sinks_on_the_gpu() -> None:
    """gpt-oss: head dim 64, causal, window 128, GQA 8:1, sinks; bfloat16 values and gradients."""
    case = {"shape": (1, 384, 16, 384, 2, 64), "causal": True, "sliding_window": (128, 0), "sink_scale": 2.0}
    assert check_flash_attention_sinks("triton", dtypes=(jnp.bfloat16,), cases=[case]) == 1
    assert check_flash_attention_sinks("triton", dtypes=(jnp.float32,), cases=SINKS_CASES, lse=True) == len(SINKS_CASES)
