"""Attention sinks and ``precision`` through ejk-xla (the portable path): flash attention and its lse
variant (values and gradients, the sinks' included), paged attention (per-token and tiled), the
implementations that do not take sinks (cuDNN) refusing them with a reason, and ``ejk bench``'s presets."""

from __future__ import annotations

from typing import Any

import attrs
import jax
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
from ejk_xla import FlashAttentionConfig
from ejk_xla._paged_attention import PagedAttentionConfig

SMALL = ejk.ImplChoice(platform="xla", backend="any", implementation="chunked",
                       cfg=FlashAttentionConfig(block_q=8, block_k=8))


@pytest.mark.parametrize("index", [0, 2, 4, 5], ids=["mha", "gqa4-window", "rows-see-nothing", "segments"])
def test_chunked_flash_attention_with_sinks(index: int) -> None:
    assert check_flash_attention_sinks("xla", dtypes=(jnp.float32,), cases=[SINKS_CASES[index]], cfg=SMALL) == 1


def test_chunked_flash_attention_lse_with_sinks() -> None:
    cases = [SINKS_CASES[3], SINKS_CASES[6], SINKS_CASES[7]]  # GQA 8 + cap, bias, dominant sinks
    assert check_flash_attention_sinks("xla", dtypes=(jnp.bfloat16,), cases=cases, lse=True) == 3


def test_sinks_of_another_dtype_are_computed_in_float32() -> None:
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 9, 4, 8)), jnp.float32) for _ in range(3))
    sinks = jnp.asarray([0.5, -1.0, 2.0, 0.0], jnp.bfloat16)
    got = ejk.flash_attention(q, k, v, causal=True, sinks=sinks, platform="xla")
    want = reference_flash_attention(q, k, v, causal=True, sinks=sinks.astype(jnp.float32))
    assert_close(got, want, jnp.float32)
    d_sinks = jax.grad(lambda s: jnp.sum(ejk.flash_attention(q, k, v, sinks=s, platform="xla") ** 2))(sinks)
    assert d_sinks.dtype == jnp.bfloat16


@pytest.mark.parametrize("cfg", [PagedAttentionConfig(pages_per_block=2), PagedAttentionConfig(q_block=2)],
                         ids=["per-token", "tiled"])
def test_paged_attention_with_sinks(cfg: PagedAttentionConfig) -> None:
    args = paged_batch(0, q_lens=[2, 3, 1], kv_lens=[10, 6, 3], num_seqs=2, pages_per_seq=4, spare_pages=4, hq=8,
                       hkv=2, d=16, dtype=jnp.float32)
    sinks = jnp.asarray(np.random.default_rng(1).standard_normal(8) * 2, jnp.float32)
    cases: list[dict[str, Any]] = [{}, {"sliding_window": 3, "logits_soft_cap": 5.0}]
    for options in cases:
        got = ejk.ragged_paged_attention(*args, sinks=sinks, platform="xla", cfg=cfg, **options)
        assert_close(got, reference_ragged_paged_attention(*args, sinks=sinks, **options), jnp.float32)


def test_cudnn_attention_refuses_sinks_with_a_reason() -> None:
    """jax's cuDNN attention has no sinks: the core refuses such calls for it (whatever the backend)."""
    kernel = ejk.ops.FlashAttentionKernel()
    (cudnn,) = (s for s in kernel.implementations() if s.label == "xla/gpu:cudnn")
    q = jax.ShapeDtypeStruct((1, 128, 4, 64), jnp.bfloat16)
    arrays, static = kernel.normalize(q, q, q, causal=True, sinks=jax.ShapeDtypeStruct((4,), jnp.float32))
    call = {**dict(zip(kernel.array_names, arrays, strict=True)), **static}
    assert kernel._gate(cudnn, call) is not None
    # Where its own gate accepts the call (a GPU), the reason is the missing argument:
    accepting = attrs.evolve(cudnn, capability=None)
    assert "does not take sinks= (added to flash_attention in ejk-core" in (kernel._gate(accepting, call) or "")


def test_bench_presets_measure_sinks_overhead() -> None:
    from ejk.ops import get_op

    labels = [case.label for case in get_op("flash_attention").bench_spec().presets]
    for label in ("[4,4096,64,64] causal w128", "[4,4096,64,64] causal w128 sinks", "[4,4096,16,128] causal",
                  "[4,4096,16,128] causal sinks"):
        assert label in labels


@pytest.mark.gpu
def test_float32_highest_precision_on_the_gpu() -> None:
    """The default ("highest") is float32-accurate on a GPU, where "default" is TF32 (about 5e-3 off)."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 512, 8, 64)), jnp.float32) for _ in range(3))
    want = reference_flash_attention(q, k, v, causal=True)
    for platform in ("xla", "triton"):
        got = ejk.flash_attention(q, k, v, causal=True, platform=platform)
        assert float(jnp.max(jnp.abs(got - want))) < 1e-4, platform


def test_the_paged_reference_agrees_with_the_flash_reference_on_sinks() -> None:
    """Each live sequence of the paged reference is flash attention of its last rows over its context
    (causal, bottom-right aligned), with the same sinks; rows of a padding sequence stay zeros."""
    args = paged_batch(3, q_lens=[3, 1, 2], kv_lens=[9, 5, 4], num_seqs=2, pages_per_seq=4, spare_pages=4, hq=4,
                       hkv=1, d=8, dtype=jnp.float32)
    q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, _ = args
    sinks = jnp.asarray([1.5, -0.5, 0.0, 3.0], jnp.float32)
    got = reference_ragged_paged_attention(*args, sinks=sinks)
    page = k_pages.shape[1]
    for s in range(2):
        start, stop, length = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
        pages = np.asarray(page_indices[s, : -(-length // page)])
        k = k_pages[pages].reshape(-1, *k_pages.shape[2:])[None, :length]
        v = v_pages[pages].reshape(-1, *v_pages.shape[2:])[None, :length]
        want = reference_flash_attention(q[None, start:stop], k, v, causal=True, sinks=sinks)[0]
        assert_close(got[start:stop], want, jnp.float32)
    assert not np.asarray(got[int(cu_q_lens[2]):]).any()
