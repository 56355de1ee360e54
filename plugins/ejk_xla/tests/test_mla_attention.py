"""The XLA latent (MLA) paged attention against the float64 reference: DeepSeek-V3's dims, edges, configs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_op, mla_batch, mla_paged_attention_float64
from ejk_xla._mla_attention import MlaAttentionConfig, config_space, heuristic_config, mla_paged_attention


def run(args: list[Any], *, dv: int = 64, config: MlaAttentionConfig | None = None, **options: Any) -> jax.Array:
    return ejk.mla_paged_attention(*args, v_head_dim=dv, platform="xla", cfg=config, **options)


def test_conformance() -> None:
    assert check_op("mla_paged_attention", "xla", dtypes=(jnp.bfloat16,)) == 3


def test_deepseek_v3_dims() -> None:
    """576 = 512 latent + 64 rotary dims, 512 value dims, pages of 64, DeepSeek's scale."""
    args = mla_batch(0, kv_lens=(130, 1, 64, 0), sq=2, hq=4, dk=576, page=64)
    options = {"softmax_scale": 192**-0.5}
    out = run(args, dv=512, **options)
    assert out.shape == (4, 2, 4, 512) and out.dtype == jnp.float32
    assert_close(out, mla_paged_attention_float64(*args, v_head_dim=512, **options), jnp.float32)
    assert not np.any(np.asarray(out[3])) and not np.any(np.asarray(out[1, 0]))  # nothing to see: zeros


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pages_per_block", [1, 3, 8])
def test_blocks_and_masks(causal: bool, pages_per_block: int) -> None:
    """Odd lengths, a 1-position context, kv_len 0, Sq > kv_len, shuffled pages, garbage table entries."""
    args = mla_batch(1, kv_lens=(13, 1, 0, 2, 29), sq=3, hq=5, dk=40, page=3)
    out = run(args, dv=24, config=MlaAttentionConfig(pages_per_block=pages_per_block), causal=causal)
    assert_close(out, mla_paged_attention_float64(*args, v_head_dim=24, causal=causal), jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_dtypes_against_float64(dtype: Any) -> None:
    args = mla_batch(2, kv_lens=(17, 5), sq=2, hq=4, dtype=dtype)
    out = run(args)
    assert out.dtype == dtype
    assert_close(out, mla_paged_attention_float64(*args, v_head_dim=64), dtype)


def test_under_jit_with_traced_lengths_and_unseen_nan() -> None:
    q, kv, lens, table = mla_batch(3, kv_lens=(6, 11), sq=2, hq=4, spare_pages=3)
    used = {int(table[b, j]) for b in range(2) for j in range(-(-int(lens[b]) // 4))}
    poisoned = np.array(kv)
    for page in set(range(kv.shape[0])) - used:
        poisoned[page] = np.nan
    poisoned[int(table[0, 1]), 2:] = np.nan  # past sequence 0's 6 positions
    call = jax.jit(lambda *a: mla_paged_attention(*a, v_head_dim=64, softmax_scale=0.25, causal=True))
    out = call(q, jnp.asarray(poisoned), lens, table)
    assert np.all(np.isfinite(np.asarray(out)))
    assert_close(out, mla_paged_attention_float64(q, kv, lens, table, v_head_dim=64, softmax_scale=0.25),
                 jnp.float32)


def test_empty_shapes() -> None:
    q, kv, lens, table = mla_batch(4, kv_lens=(3, 4), hq=4)
    assert run([q[:, :0], kv, lens, table]).shape == (2, 0, 4, 64)
    assert run([q[:0], kv, lens[:0], table[:0]]).shape == (0, 1, 4, 64)


def test_configs() -> None:
    sds = jax.ShapeDtypeStruct
    call = (sds((64, 1, 16, 576), jnp.bfloat16), sds((4096, 64, 576), jnp.bfloat16), sds((64,), jnp.int32),
            sds((64, 64), jnp.int32))
    # 512 positions per step would hold 78 MB of float32 latents and logits: 256 keep within 64 MiB
    assert heuristic_config(*call) == MlaAttentionConfig(pages_per_block=4)
    space = config_space(*call)
    assert space[0] == heuristic_config(*call) and len(set(space)) == len(space) <= 4
    tiny = (sds((1, 1, 2, 8), jnp.float32), sds((2, 4, 8), jnp.float32), sds((1,), jnp.int32), sds((1, 2), jnp.int32))
    assert heuristic_config(*tiny).pages_per_block == 2  # at most pages_per_seq
    with pytest.raises(ValueError, match="pages_per_block"):
        MlaAttentionConfig(pages_per_block=0)
