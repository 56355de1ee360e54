"""Attention sinks and ``precision`` in the Pallas kernels: the Triton-lowered and Mosaic TPU flash attention
(values and gradients, the sinks' included; interpret mode on a CPU), both paged attentions, and on a
Hopper GPU the Mosaic GPU kernel (marked ``gpu``), against the float32 references."""

from __future__ import annotations

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
    reference_ragged_paged_attention,
)
from ejk_pallas import _env
from ejk_pallas._flash_attention import FlashAttentionConfig
from ejk_pallas._flash_attention_tpu import TpuFlashAttentionConfig
from ejk_pallas._paged_attention import PagedAttentionConfig

needs_kernels = pytest.mark.skipif(not (_env.nvidia_gpu()[0] or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_PALLAS_INTERPRET=1")
needs_tpu_kernels = pytest.mark.skipif(not (jax.default_backend() == "tpu" or _env.use_interpreter()),
                                       reason="needs a TPU or EJK_PALLAS_INTERPRET=1 on a CPU")
_BACKEND = "cpu" if _env.use_interpreter() else jax.default_backend()


def choice(implementation: str, cfg: object = None) -> ejk.ImplChoice:
    return ejk.ImplChoice(platform="pallas", backend=_BACKEND, implementation=implementation, cfg=cfg)


TRITON = choice("triton_lowered", FlashAttentionConfig(block_q=16, block_k=16, bwd_block_q=16, bwd_block_k=16))
TPU = choice("mosaic_tpu", TpuFlashAttentionConfig(block_q=8, block_k=16, bwd_block_q=16, bwd_block_k=8))


@needs_kernels
def test_triton_lowered_flash_attention_with_sinks() -> None:
    """The lse variant (values, lse, gradients of q, k, v and the sinks) with rows that see no key."""
    assert check_flash_attention_sinks("pallas", dtypes=(jnp.bfloat16,), cases=[SINKS_CASES[4]], lse=True,
                                       cfg=TRITON) == 1


@needs_tpu_kernels
def test_mosaic_tpu_flash_attention_with_sinks_at_float32_precision() -> None:
    """Segment ids, GQA 2, float32 at the default "highest" precision."""
    assert check_flash_attention_sinks("pallas", dtypes=(jnp.float32,), cases=[SINKS_CASES[5]], cfg=TPU) == 1


def _paged(implementation: str, cfg: object) -> None:
    args = paged_batch(0, q_lens=[2, 3, 1], kv_lens=[10, 6, 3], num_seqs=2, pages_per_seq=4, spare_pages=4, hq=8,
                       hkv=2, d=16, dtype=jnp.float32)
    sinks = jnp.asarray(np.random.default_rng(1).standard_normal(8) * 2, jnp.float32)
    got = ejk.ragged_paged_attention(*args, sinks=sinks, sliding_window=3, platform="pallas",
                                     cfg=choice(implementation, cfg))
    assert_close(got, reference_ragged_paged_attention(*args, sinks=sinks, sliding_window=3), jnp.float32)


@needs_kernels
@pytest.mark.parametrize("splits", [1, 2])
def test_triton_lowered_paged_attention_with_sinks(splits: int) -> None:
    _paged("triton_lowered", PagedAttentionConfig(num_splits=splits))


@needs_tpu_kernels
def test_mosaic_tpu_paged_attention_with_sinks() -> None:
    _paged("mosaic_tpu", None)


@pytest.mark.gpu
def test_mosaic_gpu_with_sinks_on_a_hopper_gpu() -> None:
    """gpt-oss's shape (head dim 64, causal, window 128, GQA 8:1) with sinks, and the sinks cases of D 64."""
    mosaic = ejk.ImplChoice(platform="pallas", backend="gpu", implementation="mosaic")
    case = {"shape": (1, 384, 16, 384, 2, 64), "causal": True, "sliding_window": (128, 0), "sink_scale": 2.0}
    assert check_flash_attention_sinks("pallas", dtypes=(jnp.bfloat16,), cases=[case], cfg=mosaic) == 1
    assert check_flash_attention_sinks("pallas", dtypes=(jnp.bfloat16,), cases=[case], lse=True, cfg=mosaic) == 1
