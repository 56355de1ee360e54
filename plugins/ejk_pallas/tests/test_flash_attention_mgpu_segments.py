"""Segment ids and packed sequences (``flash_attention_varlen``) on the Mosaic GPU flash attention forward.

On a CPU the kernel runs in Pallas's Mosaic GPU interpret mode (``EJK_PALLAS_INTERPRET=1``; small shapes:
the interpreter is slow) and is lowered for CUDA without a GPU; the key block ranges computed from the ids
are checked against a brute-force visibility. Tests marked ``gpu`` run the compiled kernel on a Hopper GPU.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import (
    VARLEN_CASES,
    assert_close,
    check_flash_attention_varlen,
    reference_flash_attention,
    reference_flash_attention_varlen,
)
from ejk_pallas import _env
from ejk_pallas import _flash_attention_mgpu as mg
from ejk_pallas import _flash_attention_mgpu_bwd as bwd
from ejk_pallas import _segment_blocks as segs
from ejk_pallas import _varlen_attention_mgpu as va
from ejk_pallas._flash_attention import _make_mask
from ejk_pallas._flash_attention_mgpu import MosaicFlashAttentionConfig as Config

ON_GPU = _env.nvidia_gpu()[0]
ON_HOPPER = ON_GPU and mg.capability(*(jax.ShapeDtypeStruct((1, 8, 1, 64), jnp.bfloat16),) * 3) is None
needs_kernels = pytest.mark.skipif(
    not (ON_HOPPER or (_env.use_interpreter() and mg.interpret_params() is not None)),
    reason="needs a Hopper GPU, or EJK_PALLAS_INTERPRET=1 and jax's Mosaic GPU interpret mode on a CPU")
needs_hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU")


def _choice(cfg: Config | None = None, name: str = "mosaic") -> ejk.ImplChoice:
    """The Mosaic GPU kernels: ``mosaic_segments`` for ``flash_attention`` with segment ids, ``mosaic`` for varlen."""
    return ejk.ImplChoice(platform="pallas", backend="gpu" if ON_GPU else "cpu", implementation=name, cfg=cfg)


def _runs(*pieces: tuple[int, int]) -> np.ndarray:
    """Ids from ``(id, length)`` runs."""
    return np.concatenate([np.full(n, i, np.int32) for i, n in pieces])


def _qkv(rng: np.random.Generator, shapes: tuple[tuple[int, ...], ...], dtype: Any) -> tuple[jax.Array, ...]:
    return tuple(jnp.asarray(rng.standard_normal(s), dtype) for s in shapes)


def _check_segments(b: int, sq: int, sk: int, hq: int, hkv: int, d: int, q_ids: np.ndarray, k_ids: np.ndarray,
                    cfg: Config, *, grads: bool, dtype: str = "bfloat16", **opts: Any) -> None:
    rng = np.random.default_rng(sq * 7 + sk)
    q, k, v = _qkv(rng, ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)), jnp.dtype(dtype))
    qs, ks = jnp.asarray(q_ids, jnp.int32), jnp.asarray(k_ids, jnp.int32)
    ours = functools.partial(ejk.flash_attention, q_segment_ids=qs, kv_segment_ids=ks, platform="pallas",
                             cfg=_choice(cfg, "mosaic_segments"), **opts)
    ref = functools.partial(reference_flash_attention, q_segment_ids=qs, kv_segment_ids=ks, **opts)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    out = jax.jit(ours)(q, k, v)
    assert out.dtype == q.dtype
    assert_close(out, ref(*f32), dtype, what="out")
    if grads:
        cot = jnp.asarray(rng.standard_normal(out.shape), jnp.float32)
        got = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a).astype(jnp.float32) * cot), argnums=(0, 1, 2)))(q, k, v)
        want = jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=(0, 1, 2))(*f32)
        for name, g, w in zip("qkv", got, want, strict=True):
            assert_close(g, w, dtype, what=f"d{name}")


# ----------------------------------------------------------------------------------------------
# Interpret mode (CPU)
# ----------------------------------------------------------------------------------------------


@needs_kernels
@pytest.mark.parametrize("packed", [True, False], ids=["sorted", "id-in-two-runs"])
def test_packed_segments_values_and_grads(packed: bool) -> None:
    """Packed sequences of odd lengths, causal, GQA 2, ragged keys, the ids sorted or with id 1 in two separate
    runs: the key blocks of each query block come from the ids; gradients through the Triton-lowered Pallas
    backward (``"auto"`` in interpret mode)."""
    ids = _runs((0, 37), (1, 50), (2, 23), (3 if packed else 1, 40), (4, 50))  # 200 tokens
    _check_segments(1, 200, 200, 4, 2, 64, ids[None], ids[None], Config(block_q=128, block_kv=64), grads=True,
                    causal=True)


@needs_kernels
def test_segments_overlap_persistent_window_and_rows_that_see_nothing() -> None:
    """The intra-warpgroup overlap on two persistent CTAs (items of several lengths), causal with a window,
    GQA 2, Sq < Sk; rows 60..69 carry an id no key has (zeros); the first batch row's ids are sorted, the
    second's shuffled (unsorted: the blocks' id ranges overlap everywhere, the mask alone decides)."""
    ids = _runs((0, 37), (1, 50), (2, 23), (3, 40), (4, 80))  # 230 keys
    perm = np.random.default_rng(1).permutation(230)
    q_ids = np.stack([ids[:150], ids[perm][:150]])
    q_ids[0, 60:70] = 9
    _check_segments(2, 150, 230, 4, 2, 64, q_ids, np.stack([ids, ids[perm]]),
                    Config(block_q=128, block_kv=64, overlap=True, persistent=True), grads=False, causal=True,
                    sliding_window=(30, 0))


#: The Mosaic GPU backward (two kernels: the fused one has no segments) in interpret mode, where ``"auto"`` takes
#: the Triton-lowered one.
MOSAIC_BWD = dict(backward="mosaic", bwd_block_q=64, bwd_block_kv=64)


@needs_kernels
def test_packed_segments_mosaic_backward() -> None:
    """The same packing through the Mosaic GPU backward: dK / dV over the query blocks each key block's ids
    can meet, dQ over the key blocks; GQA 2 (dK / dV summed over the group)."""
    ids = _runs((0, 37), (1, 50), (2, 23), (1, 40), (3, 50))
    _check_segments(1, 200, 200, 4, 2, 64, ids[None], ids[None],
                    Config(block_q=128, block_kv=64, **MOSAIC_BWD), grads=True, causal=True)


def _offsets(lengths: list[int]) -> jax.Array:
    return jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)


#: The gradients of ``backward="other"`` come from another distribution's varlen implementation.
OTHER_VARLEN = any(importlib.util.find_spec(name) is not None for name in ("ejk_triton", "ejk_xla"))


@needs_kernels
@pytest.mark.parametrize("backward", [
    "mosaic",
    pytest.param("other", marks=pytest.mark.skipif(not OTHER_VARLEN, reason="needs ejk-triton or ejk-xla installed")),
])
def test_varlen_values_and_grads(backward: str) -> None:
    """Packed varlen: odd lengths, Sq != Sk per sequence (bottom-right aligned causal window), an empty
    sequence, padding tails on both sides, GQA 2, sinks; gradients from the Mosaic GPU backward with per-row
    offsets, or (``backward="auto"`` in interpret mode) another implementation's, against the float32
    reference."""
    rng = np.random.default_rng(5)
    cu_q, cu_k = _offsets([37, 0, 50, 23]), _offsets([40, 5, 30, 60])
    q, k, v = _qkv(rng, ((120, 4, 64), (140, 2, 64), (140, 2, 64)), jnp.bfloat16)
    sinks = jnp.asarray([0.5, -1.0, 0.0, 2.0], jnp.float32)
    opts: dict[str, Any] = dict(causal=True, sliding_window=(20, 0), sinks=sinks)
    ours = functools.partial(ejk.flash_attention_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, platform="pallas",
                             cfg=_choice(Config(block_q=128, block_kv=64,
                                                **(MOSAIC_BWD if backward == "mosaic" else {}))), **opts)
    out = jax.jit(ours)(q, k, v)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    ref = functools.partial(reference_flash_attention_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)
    assert_close(out, ref(*f32), "bfloat16", what="out")
    assert not np.asarray(out[110:], np.float32).any()  # padding rows
    cot = jnp.asarray(rng.standard_normal(out.shape), jnp.float32)
    got = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a).astype(jnp.float32) * cot), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=(0, 1, 2))(*f32)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert_close(g, w, "bfloat16", what=f"d{name}")


#: The shared conformance cases at a head dim the kernel takes (64).
CONFORMANCE = tuple({**case, "dim": 64} for case in VARLEN_CASES)


@needs_kernels
def test_varlen_conformance_cases() -> None:
    """Two of ejk's shared varlen cases (a window with soft cap and sinks; Sq != Sk with an empty key sequence and
    padding, GQA 4) through the Mosaic GPU forward and backward; every case on the GPU."""
    cfg = _choice(Config(block_q=128, block_kv=64, **MOSAIC_BWD))
    assert check_flash_attention_varlen("pallas", dtypes=(jnp.bfloat16,), cases=CONFORMANCE[2::2], cfg=cfg) == 2


# ----------------------------------------------------------------------------------------------
# Block ranges, token segments, gate and registration (no kernel)
# ----------------------------------------------------------------------------------------------


def _brute_visible(q_ids: np.ndarray, k_ids: np.ndarray, q_off: np.ndarray | None, sq: int, sk: int,
                   left: int | None, right: int | None) -> np.ndarray:
    i, j = np.arange(q_ids.shape[1])[:, None], np.arange(k_ids.shape[1])[None, :]
    pos = i + (sk - sq if q_off is None else q_off[:, :, None])
    vis = (q_ids[:, :, None] == k_ids[:, None, :]) & (i < sq) & (j < sk)
    if right is not None:
        vis &= j <= pos + right
    if left is not None:
        vis &= j >= pos - left
    return np.asarray(vis)


@pytest.mark.parametrize("window", [None, (None, 0), (40, 0), (30, 20)], ids=str)
@pytest.mark.parametrize("offsets", [False, True], ids=["segments", "row_offsets"])
def test_segment_ranges_hold_every_visible_block(window: tuple[int | None, int] | None, offsets: bool) -> None:
    """Every key block with a visible pair lies in its consumer's ``[lo, hi)`` (inside the CTA's range); every
    block of ``[lo_full, hi_full)`` is wholly visible; for sorted ids ``[lo, hi)`` is tight."""
    sq, sk, bq, bk = 300, 330, 128, 64
    left, right = (None, None) if window is None else window
    mask = _make_mask(sq, sk, right == 0 and left is None, None if left is None else (left, right), False)
    sqp, skp = 384, 384
    sorted_ids = _runs((0, 37), (1, 90), (2, 1), (3, 140), (4, 116))
    shuffled = np.random.default_rng(2).permutation(sorted_ids)
    q_ids = np.stack([np.pad(sorted_ids[:sq], (0, sqp - sq), constant_values=-1),
                      np.pad(shuffled[:sq], (0, sqp - sq), constant_values=-1)])
    k_ids = np.stack([np.pad(sorted_ids[:sk], (0, skp - sk), constant_values=-2),
                      np.pad(shuffled[:sk], (0, skp - sk), constant_values=-2)])
    q_off = None
    if offsets:
        q_off = np.stack([np.repeat(np.arange(0, 12, 2), 64)] * 2).astype(np.int32)
    some_, every_ = segs.block_visibility(jnp.asarray(q_ids), jnp.asarray(k_ids),
                                          None if q_off is None else jnp.asarray(q_off), mask, 64, bk)
    ranges = np.asarray(segs.block_ranges(some_, every_, bq // 64))
    vis = _brute_visible(q_ids, k_ids, q_off, sq, sk, mask.left, mask.right)
    blocks = vis.reshape(2, sqp // 64, 64, skp // bk, bk)
    some, every = blocks.any(axis=(2, 4)), blocks.all(axis=(2, 4))
    for b in range(2):
        for w in range(sqp // 64):
            lo, lo_full, hi_full, hi = ranges[b, w // 2, w % 2]
            cta_lo, cta_hi = ranges[b, w // 2, 2, :2]
            assert cta_lo <= lo <= lo_full <= hi_full <= hi <= cta_hi
            seen = np.flatnonzero(some[b, w])
            assert all(lo <= t < hi for t in seen), (b, w, seen, lo, hi)
            assert every[b, w, lo_full:hi_full].all()
            if b == 0 and len(seen):
                assert (lo, hi) == (seen[0], seen[-1] + 1)


@pytest.mark.parametrize("window", [None, (None, 0), (40, 0), (30, 20)], ids=str)
@pytest.mark.parametrize("offsets", [False, True], ids=["aligned", "row_offsets"])
def test_range_block_ranges(window: tuple[int | None, int] | None, offsets: bool) -> None:
    """Packed sequences' ranges: ``visible_bounds`` gives each row exactly its visible keys, and the block bounds
    computed from them hold every visible block, tightly, and call wholly visible exactly the blocks that are
    (one range's are contiguous: none of them is masked)."""
    sq, sk, bk = 300, 330, 64
    left, right = (None, None) if window is None else window
    mask = _make_mask(sq, sk, right == 0 and left is None, None if left is None else (left, right), False)
    sqp, skp = 384, 384
    ids = _runs((0, 37), (1, 90), (2, 1), (3, 140), (4, 116))
    q_row = ids[:sq].copy()
    q_row[100:110] = 7  # an id no key has: an empty range
    q_ids = np.pad(q_row, (0, sqp - sq), constant_values=-1)[None]
    k_ids = np.pad(ids[:sk], (0, skp - sk), constant_values=-2)[None]
    starts = {i: int(np.flatnonzero(ids[:sk] == i)[0]) for i in range(5)}
    k_lo = np.array([[starts.get(int(i), 0) for i in q_ids[0]]], np.int32)
    k_hi = np.array([[starts[int(i)] + int(np.sum(ids[:sk] == i)) if int(i) in starts else 0 for i in q_ids[0]]],
                    np.int32)
    q_off = np.repeat(np.arange(0, 12, 2), 64)[None].astype(np.int32) if offsets else None
    lo, hi = segs.visible_bounds(jnp.asarray(k_lo), jnp.asarray(k_hi), None if q_off is None else jnp.asarray(q_off),
                                 mask)
    ranges = np.asarray(segs.range_block_ranges(lo, hi, sq, bk, 2))
    lo, hi = np.asarray(lo), np.asarray(hi)
    vis = _brute_visible(q_ids, k_ids, q_off, sq, sk, mask.left, mask.right)
    for i in range(sq):
        np.testing.assert_array_equal(np.arange(lo[0, i], hi[0, i]), np.flatnonzero(vis[0, i]))
    blocks = vis.reshape(1, sqp // 64, 64, skp // bk, bk)
    some, every = blocks.any(axis=(2, 4)), blocks.all(axis=(2, 4))
    for w in range(sqp // 64):
        lo_, lo_full, hi_full, hi_ = ranges[0, w // 2, w % 2]
        cta_lo, cta_hi = ranges[0, w // 2, 2, :2]
        assert cta_lo <= lo_ <= lo_full <= hi_full <= hi_ <= cta_hi
        seen, full = np.flatnonzero(some[0, w]), np.flatnonzero(every[0, w])
        if len(seen):
            assert (lo_, hi_) == (seen[0], seen[-1] + 1), (w, seen, lo_, hi_)
        assert every[0, w, lo_full:hi_full].all()
        if len(full):
            assert (lo_full, hi_full) == (full[0], full[-1] + 1), (w, full, lo_full, hi_full)


@pytest.mark.parametrize("window", [None, (None, 0), (40, 0), (30, 20)], ids=str)
def test_key_visible_bounds(window: tuple[int | None, int] | None) -> None:
    """The backward's key side of packed sequences (Sq != Sk per sequence, an empty one, padding): each key's
    range is exactly the queries that see it, and the query blocks computed from those ranges for 64-key
    consumers hold every visible block, tightly, and call wholly visible exactly the blocks that are."""
    q_lens, k_lens = (37, 90, 1, 0, 140), (50, 80, 3, 10, 150)
    sq, sk, sqp, skp, bq = sum(q_lens), sum(k_lens), 384, 384, 64
    left, right = (None, None) if window is None else window
    mask = _make_mask(sq, sk, right == 0 and left is None, None if left is None else (left, right), False)
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (q_lens, k_lens))
    q_ids = np.pad(np.repeat(np.arange(5), q_lens), (0, sqp - sq), constant_values=-1)[None].astype(np.int32)
    k_ids = np.pad(np.repeat(np.arange(5), k_lens), (0, skp - sk), constant_values=-2)[None].astype(np.int32)
    off = cu_k[1:] - cu_q[1:]
    q_off = np.where(q_ids >= 0, off[np.clip(q_ids, 0, 4)], 0).astype(np.int32)
    real = k_ids >= 0
    s = np.clip(k_ids, 0, 4)
    q_lo, q_hi, k_off = (np.where(real, x, 0).astype(np.int32) for x in (cu_q[s], cu_q[s + 1], off[s]))
    lo, hi = (np.asarray(x) for x in segs.key_visible_bounds(jnp.asarray(q_lo), jnp.asarray(q_hi),
                                                             jnp.asarray(k_off), mask))
    vis = _brute_visible(q_ids, k_ids, q_off, sq, sk, mask.left, mask.right)[0].T  # keys x queries
    for j in range(skp):
        np.testing.assert_array_equal(np.arange(lo[0, j], hi[0, j]), np.flatnonzero(vis[j]), err_msg=f"key {j}")
    ranges = np.asarray(segs.range_block_ranges(jnp.asarray(lo), jnp.asarray(hi), sk, bq, 2))
    blocks = vis.reshape(skp // 64, 64, sqp // bq, bq)
    some, every = blocks.any(axis=(1, 3)), blocks.all(axis=(1, 3))
    for w in range(skp // 64):
        lo_, lo_full, hi_full, hi_ = ranges[0, w // 2, w % 2]
        assert ranges[0, w // 2, 2, 0] <= lo_ <= lo_full <= hi_full <= hi_ <= ranges[0, w // 2, 2, 1]
        seen, full = np.flatnonzero(some[w]), np.flatnonzero(every[w])
        if len(seen):
            assert (lo_, hi_) == (seen[0], seen[-1] + 1), (w, seen, lo_, hi_)
        assert every[w, lo_full:hi_full].all()
        if len(full):
            assert (lo_full, hi_full) == (full[0], full[-1] + 1), (w, full, lo_full, hi_full)


def test_token_segments() -> None:
    q_ids, k_ids, q_off, (k_lo, k_hi) = va.token_segments(_offsets([3, 0, 2]), _offsets([1, 4, 3]), 7, 9)
    np.testing.assert_array_equal(q_ids, [0, 0, 0, 2, 2, -1, -1])
    np.testing.assert_array_equal(k_ids, [0, 1, 1, 1, 1, 2, 2, 2, -2])
    np.testing.assert_array_equal(q_off[:5], [-2, -2, -2, 3, 3])  # cu_k[s+1] - cu_q[s+1]
    # Each row's keys: exactly those whose id is the row's (empty for rows of no sequence).
    for i, row_id in enumerate(np.asarray(q_ids)):
        keys = np.flatnonzero(np.asarray(k_ids) == row_id) if row_id >= 0 else np.array([], int)
        np.testing.assert_array_equal(np.arange(k_lo[i], k_hi[i]), keys)
    _, _, _, (lo0, hi0) = va.token_segments(_offsets([]), _offsets([]), 3, 2)  # no sequences: every range empty
    assert not np.any(np.asarray(hi0) - np.asarray(lo0))


def test_gates_and_registration() -> None:
    q = jax.ShapeDtypeStruct((100, 4, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((120, 2, 128), jnp.bfloat16)
    assert va.capability(q, k, k) == mg.capability(*(jax.ShapeDtypeStruct((1, *x.shape), x.dtype) for x in (q, k, k)))
    assert "float32" in (va.capability(*(jax.ShapeDtypeStruct((8, 2, 64), jnp.float32),) * 3) or "")
    spec = ejk.kernel_registry.get_spec("flash_attention_varlen", platform="pallas", backend="gpu", name="mosaic")
    assert spec.label == "pallas/gpu:mosaic" and spec.cfg_type is Config
    assert isinstance(va.heuristic_config(q, k, k, causal=True), Config)


def test_segment_ids_take_the_ping_pong(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pallas/gpu:mosaic_segments``'s heuristic is the dense one without the overlap (whose consumers spill with
    the key ids' vector); the registered spec uses it."""
    from ejk_pallas import _env

    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    for d in (64, 128):
        for options in (dict(causal=True), dict(causal=False)):
            q = jax.ShapeDtypeStruct((4, 4096, 16, d), jnp.bfloat16)
            dense, seg = mg.heuristic_config(q, q, q, **options), mg.segments_heuristic_config(q, q, q, **options)
            assert not seg.overlap and seg.persistent and seg.block_q == 128
            assert attrs.evolve(dense, block_q=128, overlap=False, max_concurrent_steps=seg.max_concurrent_steps) == seg
    spec = ejk.kernel_registry.get_spec("flash_attention", platform="pallas", backend="gpu", name="mosaic_segments")
    assert spec.heuristic is mg.segments_heuristic_config


def _lower(cfg: Config, d: int, offsets: bool, **opts: Any) -> None:
    q = jax.ShapeDtypeStruct((2, 1000, 8, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 1100, 2, d), jnp.bfloat16)
    qs, ks = jax.ShapeDtypeStruct((2, 1000), jnp.int32), jax.ShapeDtypeStruct((2, 1100), jnp.int32)

    def f(q: Any, k: Any, v: Any, qs: Any, ks: Any, qo: Any) -> Any:
        return mg._forward_impl(q, k, v, cfg=cfg, softmax_scale=d ** -0.5, interpret=False, logits_soft_cap=None,
                                segments=(qs, ks, qo), **opts)

    text = jax.jit(f).trace(q, k, k, qs, ks, qs if offsets else None).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("cfg", [Config(block_q=128, block_kv=128),
                                 Config(block_q=128, block_kv=128, overlap=True, persistent=True)],
                         ids=["pingpong", "overlap-persistent"])
def test_varlen_forward_lowers_for_cuda_without_the_key_ids(cfg: Config) -> None:
    """Packed sequences lower with each row's folded key range; the kernel takes no key ids then, so a
    forward-only program does not compute them (the launch has one operand fewer than with segment ids)."""
    q = jax.ShapeDtypeStruct((1, 3000, 8, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 3100, 2, 128), jnp.bfloat16)
    cu_q, cu_k = jax.ShapeDtypeStruct((5,), jnp.int32), jax.ShapeDtypeStruct((5,), jnp.int32)

    def f(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any) -> Any:
        q_ids, k_ids, q_off, bounds = va.token_segments(cu_q, cu_k, 3000, 3100)
        return mg._forward_impl(q, k, v, cfg=cfg, softmax_scale=0.1, interpret=False, logits_soft_cap=None,
                                causal=True, sliding_window=None,
                                segments=(q_ids[None], k_ids[None], q_off[None], tuple(b[None] for b in bounds)))

    lowered = jax.jit(f).trace(q, k, k, cu_q, cu_k).lower(lowering_platforms=("cuda",))
    calls = [line for line in lowered.as_text().splitlines() if "mosaic_gpu" in line and "custom_call" in line]
    assert len(calls) == 1
    # q, k, v, the rows' bounds and the block bounds: no key ids.
    assert calls[0].split("(", 1)[1].split(")", 1)[0].count("%") == 5, calls[0][:400]


@pytest.mark.parametrize("cfg,d,offsets", [
    (Config(block_q=128, block_kv=128), 128, False),
    (Config(block_q=128, block_kv=128, overlap=True, persistent=True), 128, True),
    (Config(block_q=192, block_kv=128, max_concurrent_steps=3, overlap=True, persistent=True), 64, False),
    (Config(block_q=128, block_kv=64, max_concurrent_steps=3, persistent=True), 64, True),
], ids=["pingpong", "overlap-persistent-offsets", "three-consumers", "pingpong-persistent-offsets"])
def test_segments_lower_for_cuda(cfg: Config, d: int, offsets: bool) -> None:
    _lower(cfg, d, offsets, causal=True, sliding_window=(256, 0))


@pytest.mark.parametrize("d,blocks,offsets", [(128, (64, 128), False), (64, (128, 128), True), (128, (64, 64), True)])
def test_segments_backward_lowers_for_cuda(d: int, blocks: tuple[int, int], offsets: bool) -> None:
    q = jax.ShapeDtypeStruct((2, 1000, 4, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 1100, 2, d), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((2, 4, 1000), jnp.float32)
    qs, ks = jax.ShapeDtypeStruct((2, 1000), jnp.int32), jax.ShapeDtypeStruct((2, 1100), jnp.int32)

    def f(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, qs: Any, ks: Any, qo: Any) -> Any:
        return bwd.backward_impl(q, k, v, o, lse, do, block_q=blocks[0], block_kv=blocks[1], steps=2, causal=True,
                                 softmax_scale=d ** -0.5, sliding_window=(300, 0), logits_soft_cap=None,
                                 interpret_params=None, segments=(qs, ks, qo))

    lowered = jax.jit(f).trace(q, k, k, q, lse, q, qs, ks, qs if offsets else None).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("mosaic_gpu") >= 2  # the dK / dV and the dQ kernels


@pytest.mark.parametrize("window", [None, (64, 0)], ids=["causal", "window"])
def test_varlen_backward_lowers_for_cuda_with_ranges(window: tuple[int, int] | None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed sequences' gradients lower to the forward and the two backward kernels, which take the rows'
    ranges instead of ids: no id ring, so each backward launch has one operand fewer than with segment ids."""
    from ejk_pallas import _env

    monkeypatch.setattr(_env, "use_interpreter", lambda: False)  # compiled for the GPU: the Mosaic backward
    q = jax.ShapeDtypeStruct((3000, 8, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((3100, 2, 128), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((5,), jnp.int32)

    def f(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any) -> Any:
        out = va.flash_attention_varlen(q, k, v, cu_q, cu_k, sinks=None, causal=True, softmax_scale=0.1,
                                        sliding_window=window, logits_soft_cap=None, max_seqlen_q=None,
                                        max_seqlen_k=None, precision="default")
        return jnp.sum(out.astype(jnp.float32))

    lowered = jax.jit(jax.grad(f, argnums=(0, 1, 2))).trace(q, k, k, cu, cu).lower(lowering_platforms=("cuda",))
    calls = [line for line in lowered.as_text().splitlines() if "mosaic_gpu" in line and "custom_call" in line]
    assert len(calls) == 3
    # q, k, v, dO, lse, delta, the rows' ranges and the block bounds.
    assert [c.split("(", 1)[1].split(")", 1)[0].count("%") for c in calls[1:]] == [8, 8], [c[:300] for c in calls]


def test_fused_backward_refuses_segments() -> None:
    x = jnp.zeros((1, 8, 1, 64), jnp.bfloat16)
    ids = jnp.zeros((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="fused"):
        bwd.backward_impl(x, x, x, x, jnp.zeros((1, 1, 8)), x, block_q=64, block_kv=64, steps=2, causal=False,
                          softmax_scale=1.0, sliding_window=None, logits_soft_cap=None, interpret_params=None,
                          fused=True, segments=(ids, ids, None))


# ----------------------------------------------------------------------------------------------
# Hopper GPU
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_packed_segments(d: int) -> None:
    rng = np.random.default_rng(d)
    lengths = rng.integers(1, 700, size=12)
    ids = np.repeat(np.arange(12), lengths)[:2048]
    ids = np.pad(ids, (0, 2048 - len(ids)), constant_values=12)
    _check_segments(2, 2048, 2048, 8, 2, d, np.stack([ids, ids[::-1]]), np.stack([ids, ids[::-1]]),
                    mg.heuristic_config(*(jax.ShapeDtypeStruct((2, 2048, 8, d), jnp.bfloat16),) * 3, causal=True),
                    grads=True, causal=True)
    _check_segments(1, 1000, 1500, 8, 8, d, ids[None, :1000], ids[None, :1500], Config(block_q=128, block_kv=128),
                    grads=False, sliding_window=(128, 64), logits_soft_cap=30.0)


@pytest.mark.gpu
@needs_hopper
def test_gpu_varlen_conformance_cases() -> None:
    assert check_flash_attention_varlen("pallas", dtypes=(jnp.bfloat16,), cases=CONFORMANCE, cfg=_choice()) == 6


@pytest.mark.gpu
@needs_hopper
def test_gpu_varlen() -> None:
    rng = np.random.default_rng(0)
    lens_q = [int(x) for x in rng.integers(0, 900, size=9)]
    lens_k = [x + int(rng.integers(0, 50)) for x in lens_q]
    cu_q, cu_k = _offsets(lens_q), _offsets(lens_k)
    tq, tk = int(cu_q[-1]) + 17, int(cu_k[-1]) + 3
    q, k, v = _qkv(rng, ((tq, 16, 128), (tk, 4, 128), (tk, 4, 128)), jnp.bfloat16)
    ours = functools.partial(ejk.flash_attention_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                             platform="pallas", cfg=_choice())
    ref = functools.partial(reference_flash_attention_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    assert_close(jax.jit(ours)(q, k, v), ref(*f32), "bfloat16", what="out")
    cot = jnp.asarray(rng.standard_normal((tq, 16, 128)), jnp.float32)
    got = jax.jit(jax.grad(lambda *a: jnp.sum(ours(*a).astype(jnp.float32) * cot), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=(0, 1, 2))(*f32)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert_close(g, w, "bfloat16", what=f"d{name}")
