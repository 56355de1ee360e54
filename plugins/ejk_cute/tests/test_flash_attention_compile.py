"""The compile path on any machine: lowering a jitted call for CUDA compiles the CuTe kernel for
sm_90a into the HLO (the custom call carries the binary). This catches DSL errors without a GPU.

Every config of both head dims' spaces compiles in both dtypes; the mask / soft-cap / GQA variants
rotate over them so each variant meets each head dim (the full product would take minutes).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from ejk.ops import with_natural_lse, without_residuals
from ejk_cute import _compile
from ejk_cute import _flash_attention as fa

pytest.importorskip("cutlass.jax", reason="nvidia-cutlass-dsl is not installed")

S = jax.ShapeDtypeStruct
CUSTOM_CALL = _compile.CUSTOM_CALL_TARGET
#: The kernel's ``flash_attention_lse`` forward (the core derives it from the residuals' base-2 lse).
FORWARD_LSE = without_residuals(with_natural_lse(fa.forward_with_residuals), "forward_lse")

#: (name, static options, (Sq, Sk, Hq, Hkv)): lengths off the block multiples, Sq != Sk where masks align.
VARIANTS: tuple[tuple[str, dict[str, Any], tuple[int, int, int, int]], ...] = (
    ("causal", dict(causal=True), (200, 333, 4, 4)),
    ("window", dict(sliding_window=(70, 20)), (257, 190, 2, 2)),
    ("softcap-gqa", dict(logits_soft_cap=30.0), (129, 300, 8, 1)),
    ("causal-window-softcap-gqa", dict(causal=True, sliding_window=(100, 0), logits_soft_cap=20.0), (1, 77, 4, 2)),
    ("causal-gqa3-unpacked", dict(causal=True), (130, 150, 6, 2)),  # a group of 3 does not divide 64 rows
)


def _lowered(fn: Any, *structs: S) -> str:
    exported = _compile.export_for_cuda(fn, *structs)
    assert len(_compile.kernel_calls(exported)) == 1
    return str(exported.mlir_module())


def _call(d: int, dtype: Any, cfg: fa.FlashAttentionConfig, variant: int, b: int = 2) -> tuple[Any, tuple[S, ...]]:
    _, options, (sq, sk, hq, hkv) = VARIANTS[variant]
    static = dict(causal=False, softmax_scale=d ** -0.5, sliding_window=None, logits_soft_cap=None,
                  q_segment_ids=None, kv_segment_ids=None, bias=None) | options
    fn = functools.partial(FORWARD_LSE, cfg=cfg, **static)
    return fn, (S((b, sq, hq, d), dtype), S((b, sk, hkv, d), dtype), S((b, sk, hkv, d), dtype))


CASES = [(d, i, cfg) for d in fa.HEAD_DIMS
         for i, cfg in enumerate(fa.config_space(S((1, 1, 1, d), jnp.bfloat16), None, None))]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("d", "index", "cfg"), CASES,
                         ids=[f"d{d}-kv{c.block_kv}x{c.stages}{'-persistent' * c.persistent}-"
                              f"{VARIANTS[i % len(VARIANTS)][0]}" for d, i, c in CASES])
def test_every_config_compiles_for_sm90a(d: int, index: int, cfg: fa.FlashAttentionConfig, dtype: str) -> None:
    variant = (index + (dtype == "float16")) % len(VARIANTS)
    fn, structs = _call(d, jnp.dtype(dtype), cfg, variant)
    text = _lowered(fn, *structs)
    assert CUSTOM_CALL in text
    b, sq, hq, _ = structs[0].shape
    assert f"tensor<{b}x{hq}x{sq}xf32>" in text  # the lse output rides along


#: Half of (head dim × variant): the config sweep above covers the other half.
HEURISTIC_CASES = [(d, v) for d in fa.HEAD_DIMS for v in range(len(VARIANTS)) if not (v + d // 64) % 2]


@pytest.mark.parametrize(("d", "variant"), HEURISTIC_CASES, ids=[f"d{d}-{VARIANTS[v][0]}" for d, v in HEURISTIC_CASES])
def test_every_variant_compiles_with_the_heuristic_config(d: int, variant: int) -> None:
    q = S((1, 1, 1, d), jnp.bfloat16)
    fn, structs = _call(d, jnp.bfloat16, fa.heuristic_config(q, q, q), variant)
    assert CUSTOM_CALL in _lowered(fn, *structs)


@pytest.mark.parametrize(("d", "shape", "options"), [
    (64, (200, 200, 16, 2), dict(causal=True, sliding_window=(128, 0))),  # gpt-oss: packed GQA 8, window 128
    (128, (130, 150, 6, 2), dict(causal=True)),  # GQA 3: unpacked
], ids=["d64-packed-window", "d128-unpacked"])
def test_sinks_compile_into_the_epilogue(d: int, shape: tuple[int, int, int, int], options: dict[str, Any]) -> None:
    """Sinks are read per (query head, batch) in the epilogue: the variant with them compiles, packed or not."""
    sq, sk, hq, hkv = shape
    static = dict(causal=False, softmax_scale=d ** -0.5, sliding_window=None, logits_soft_cap=None,
                  q_segment_ids=None, kv_segment_ids=None, bias=None) | options

    def fn(q: jax.Array, k: jax.Array, v: jax.Array, sinks: jax.Array) -> Any:
        return FORWARD_LSE(q, k, v, sinks=sinks, **static)

    kv = S((2, sk, hkv, d), jnp.bfloat16)
    text = _lowered(fn, S((2, sq, hq, d), jnp.bfloat16), kv, kv, S((hq,), jnp.float32))
    assert CUSTOM_CALL in text and f"tensor<2x{hq}xf32>" in text  # the sinks ride in, one per (batch, head)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_grid_with_more_items_than_sms_compiles(causal: bool) -> None:
    """2048 work items on the persistent grid: each CTA walks a snake of them (``ejk.tiling``)."""
    cfg = fa.FlashAttentionConfig(block_kv=128, stages=2, persistent=True)
    assert fa._grid_ctas(cfg, 8, 2048, 16, 2048, causal, None) in range(120, 133)
    fn = functools.partial(FORWARD_LSE, cfg=cfg, causal=causal, softmax_scale=0.125, sliding_window=None,
                           logits_soft_cap=None, q_segment_ids=None, kv_segment_ids=None, bias=None)
    q = S((8, 2048, 16, 128), jnp.bfloat16)
    assert CUSTOM_CALL in _lowered(fn, q, S((8, 2048, 4, 128), jnp.bfloat16), S((8, 2048, 4, 128), jnp.bfloat16))


def test_tile_blocks_match_the_kernel_bounds() -> None:
    """The host's per-tile key block counts (what the persistent grid balances), last tiles first when causal."""
    assert fa._tile_blocks(512, 512, 128, False, None) == [4, 4, 4, 4]
    assert fa._tile_blocks(512, 512, 128, True, None) == [4, 3, 2, 1]
    assert fa._tile_blocks(200, 333, 64, True, None) == [6, 5]  # bottom-right aligned: rows 0..127 see keys < 261
    assert fa._tile_blocks(256, 256, 64, False, (70, 20)) == [4, 3]  # rows 128..255 see keys 58..255; 0..127 < 148
    assert fa._tile_blocks(1, 77, 64, True, (100, 0)) == [2]
    # Packed GQA: a tile holds 128 / pack positions of pack heads (rows 384..399 are positions 96..99).
    assert fa._tile_blocks(100, 100, 64, True, None, pack=4) == [2, 2, 1, 1]
    assert fa._tile_blocks(100, 100, 64, False, None, pack=4) == [2, 2, 2, 2]
    assert fa._grid_ctas(fa.FlashAttentionConfig(), 8, 2048, 16, 2048, True, None) == 0  # one CTA per item


def test_gqa_packs_groups_that_divide_a_warpgroup() -> None:
    assert [fa.pack_of(hq, hkv) for hq, hkv in ((4, 4), (8, 1), (4, 2), (64, 1), (6, 2), (128, 1), (96, 1))] == [
        1, 8, 2, 64, 1, 1, 1]


def test_without_pingpong_compiles() -> None:
    fn, structs = _call(128, jnp.bfloat16, fa.FlashAttentionConfig(pingpong=False), 3)
    assert CUSTOM_CALL in _lowered(fn, *structs)


def test_vmap_folds_into_one_launch() -> None:
    cfg = fa.FlashAttentionConfig()
    fn = functools.partial(fa.forward, causal=True, softmax_scale=0.125, sliding_window=None, logits_soft_cap=None,
                           q_segment_ids=None, kv_segment_ids=None, bias=None, cfg=cfg)
    q = S((3, 2, 130, 4, 64), jnp.bfloat16)
    k = S((2, 130, 2, 64), jnp.bfloat16)  # unmapped: broadcast along the mapped axis
    text = _lowered(jax.vmap(fn, in_axes=(0, None, None)), q, k, k)
    assert text.count(CUSTOM_CALL) == 1
    assert "tensor<6x130x4x64xbf16>" in text
