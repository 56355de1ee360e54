"""The Triton varlen attention through Triton's interpreter (tiny shapes), compiled for sm_90 without a
GPU, and (``gpu``) on an NVIDIA GPU against the XLA implementation at realistic packings."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import (
    VARLEN_CASES,
    assert_close,
    check_flash_attention_varlen,
    check_varlen_against_float64,
    reference_flash_attention,
)
from ejk_triton import _env
from ejk_triton._varlen_attention import VarlenAttentionConfig, capability, config_space, heuristic_config

ON_GPU = _env.nvidia_gpu()[0]

CASES = [
    pytest.param({"q_lens": (5, 0, 20, 1), "k_lens": (5, 0, 20, 1), "pad": 3, "heads": (4, 2), "dim": 16,
                  "causal": True}, id="empty-pad-gqa2"),
    pytest.param({"q_lens": (3, 18), "k_lens": (9, 13), "heads": (8, 1), "dim": 16, "causal": True,
                  "sliding_window": 4, "sinks": True}, id="sq!=sk-window-sinks-gqa8"),
    pytest.param({"q_lens": (45, 38), "k_lens": (45, 40), "heads": (2, 1), "dim": 16, "causal": True},
                 id="long-causal-interior-blocks"),
    pytest.param({"q_lens": (17, 6), "k_lens": (17, 0), "pad": 1, "heads": (4, 4), "dim": 24,
                  "logits_soft_cap": 4.0, "sinks": True}, id="empty-keys-cap-d24"),
]


@pytest.mark.parametrize("case", CASES)
def test_interpreter_against_float64_reference(case: dict[str, Any]) -> None:
    check_varlen_against_float64("triton", case, jnp.float32)


def test_interpreter_conformance_bfloat16() -> None:
    assert check_flash_attention_varlen("triton", dtypes=(jnp.bfloat16,), cases=VARLEN_CASES[1::2]) == 3


def _sds(shape: tuple[int, ...], dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def test_capability_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    assert capability(_sds((100, 8, 128)), _sds((90, 2, 128)), _sds((90, 2, 128))) is None
    assert capability(_sds((100, 8, 512)), _sds((90, 2, 512)), _sds((90, 2, 512))) == (
        "head_dim 512 not supported (at most 256)")
    f32 = _sds((100, 8, 256), jnp.float32)
    assert "head_dim 256 not supported in float32" in (capability(f32, f32, f32) or "")
    if not ON_GPU:
        monkeypatch.delenv("EJK_TRITON_INTERPRET")
        assert (capability(_sds((4, 1, 16)), _sds((4, 1, 16)), _sds((4, 1, 16))) or "").startswith(
            "needs an NVIDIA GPU")


def test_configs_on_gpu_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)
    for d, dtype in ((64, jnp.bfloat16), (128, jnp.bfloat16), (256, jnp.float16), (128, jnp.float32)):
        q = _sds((4096, 16, d), dtype)
        space = config_space(q, q, q)
        assert space and space[0] == heuristic_config(q, q, q)
        assert all(isinstance(c, VarlenAttentionConfig) for c in space)


_AOT_SCRIPT = """
import json, jax, jax.numpy as jnp
from ejk_triton._varlen_attention import compile_kernels
sds = jax.ShapeDtypeStruct
q, kv = sds((32768, 16, 128), jnp.bfloat16), sds((32768, 4, 128), jnp.bfloat16)
report = {"d128 gqa sinks": compile_kernels(q, kv, kv, sinks=True)}
q64 = sds((1000, 64, 64), jnp.bfloat16)
report["d64 cap"] = compile_kernels(q64, q64, q64, logits_soft_cap=30.0)
q32 = sds((333, 4, 128), jnp.float32)
report["f32"] = compile_kernels(q32, q32, q32)
report["segments causal"] = compile_kernels(q, kv, kv, segment_ids=True, causal=True)
print(json.dumps(report))
"""


def test_kernels_compile_for_sm90_without_a_gpu(compile_report: Any) -> None:
    report = compile_report(_AOT_SCRIPT)
    for variant, kernels in report.items():
        assert set(kernels) == {"forward", "preprocess", "dkdv", "dq"}, variant
        for name, info in kernels.items():
            assert 0 < info["shared"] <= 227 * 1024, f"{variant} {name}: {info}"


# ----------------------------------------------------------------------------------------------
# On an NVIDIA GPU
# ----------------------------------------------------------------------------------------------


def _packed(lens: list[int], pad: int, hq: int, hkv: int, d: int, dtype: Any, seed: int = 0) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    t = sum(lens) + pad
    q, k, v = (jnp.asarray(rng.standard_normal((t, h, d), np.float32), dtype) for h in (hq, hkv, hkv))
    cu = jnp.asarray(np.cumsum([0, *lens]), jnp.int32)
    return q, k, v, cu


GPU_CASES = [
    pytest.param([1000, 3, 2500, 0, 777], 100, 16, 4, 128, jnp.bfloat16, {"causal": True}, id="d128-gqa4-causal"),
    pytest.param([1500, 700, 1], 13, 8, 8, 64, jnp.float16,
                 {"causal": True, "sliding_window": 128, "sinks": True}, id="d64-window128-sinks"),
    pytest.param([300, 200], 0, 4, 1, 256, jnp.bfloat16, {"logits_soft_cap": 30.0}, id="d256-mqa-cap"),
    pytest.param([400, 333], 7, 4, 2, 128, jnp.float32, {"causal": True}, id="f32-highest"),
]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("lens", "pad", "hq", "hkv", "d", "dtype", "options"), GPU_CASES)
def test_gpu_matches_xla(lens: list[int], pad: int, hq: int, hkv: int, d: int, dtype: Any,
                         options: dict[str, Any]) -> None:
    q, k, v, cu = _packed(lens, pad, hq, hkv, d, dtype)
    options = dict(options)
    if options.pop("sinks", False):
        options["sinks"] = jnp.linspace(-1.0, 2.0, hq, dtype=jnp.float32)
    ct = jnp.asarray(np.random.default_rng(1).standard_normal((q.shape[0], hq, d), np.float32), dtype)

    def grads(platform: str) -> Any:
        def f(q: Any, k: Any, v: Any) -> Any:
            return ejk.flash_attention_varlen(q, k, v, cu, cu, platform=platform, **options)

        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(ct)

    got, got_g = jax.jit(lambda: grads("triton"))()
    want, want_g = jax.jit(lambda: grads("xla"))()
    assert_close(got, want, dtype, what="out")
    for name, a, b in zip(("dq", "dk", "dv"), got_g, want_g, strict=True):
        assert_close(a, b, dtype, what=name)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_public_op_conformance() -> None:
    assert check_flash_attention_varlen("triton", dtypes=(jnp.bfloat16, jnp.float16, jnp.float32)) == 18


# ----------------------------------------------------------------------------------------------
# flash_attention with segment ids on the varlen kernels (triton/...:segments)
# ----------------------------------------------------------------------------------------------

SEGMENTS = ejk.ImplChoice(platform="triton", backend="gpu" if ON_GPU else "cpu", implementation="segments")


def _segment_ids(rng: np.random.Generator, batch: int, length: int, kind: str) -> jax.Array:
    if kind == "packed":  # contiguous documents of random lengths, a padding id at the end
        ids = np.zeros((batch, length), np.int32)
        for b in range(batch):
            cuts = np.sort(rng.choice(np.arange(1, length), size=3, replace=False))
            ids[b] = np.searchsorted(cuts, np.arange(length), side="right")
        return jnp.asarray(ids)
    ids = rng.integers(0, 3, size=(batch, length))  # arbitrary: runs interleave
    if kind == "colliding":  # ids hashed to one bucket (id mod length): the intervals hold every id's keys
        ids = np.asarray([0, length, -2 * length])[ids]
    return jnp.asarray(ids, jnp.int32)


@pytest.mark.parametrize(("kind", "shape", "options"), [
    pytest.param("packed", (2, 40, 4, 40, 2, 16), {"causal": True}, id="packed-causal-gqa2"),
    pytest.param("arbitrary", (1, 24, 4, 33, 1, 16), {}, id="arbitrary-sq!=sk-mqa"),
    pytest.param("colliding", (2, 30, 2, 30, 2, 16), {"causal": True, "sliding_window": 5, "logits_soft_cap": 3.0},
                 id="colliding-window-cap"),
])
def test_segments_kernel_matches_the_reference(kind: str, shape: tuple[int, ...], options: dict[str, Any]) -> None:
    b, sq, hq, sk, hkv, d = shape
    rng = np.random.default_rng(sum(shape))
    q = jnp.asarray(rng.standard_normal((b, sq, hq, d)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, sk, hkv, d)), jnp.float32) for _ in range(2))
    q_ids = _segment_ids(rng, b, sq, kind)
    kv_ids = q_ids if sq == sk else _segment_ids(rng, b, sk, kind)
    ct = jnp.asarray(rng.standard_normal((b, sq, hq, d)), jnp.float32)

    def run(fn: Any) -> Any:
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids, **options), q, k, v)
        return out, vjp(ct)

    got, got_g = jax.jit(lambda: run(lambda *a, **kw: ejk.flash_attention(*a, **kw, platform="triton", cfg=SEGMENTS)))()
    want, want_g = jax.jit(lambda: run(reference_flash_attention))()
    assert_close(got, want, jnp.float32, what="out")
    for name, a, w in zip(("dq", "dk", "dv"), got_g, want_g, strict=True):
        assert_close(a, w, jnp.float32, what=name)


def test_segments_gate_takes_segment_calls_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from ejk_triton._segment_attention import capability as segments_gate

    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    q, ids = _sds((2, 64, 4, 64)), _sds((2, 64), jnp.int32)
    assert segments_gate(q, q, q, q_segment_ids=ids, kv_segment_ids=ids) is None
    assert "segment ids only" in (segments_gate(q, q, q) or "")
    assert "no bias" in (segments_gate(q, q, q, q_segment_ids=ids, kv_segment_ids=ids,
                                       bias=_sds((1, 1, 64, 64))) or "")


# ----------------------------------------------------------------------------------------------
# The interval bookkeeping (plain JAX) against brute force
# ----------------------------------------------------------------------------------------------


def _check_key_block_rows(lo: np.ndarray, hi: np.ndarray, ids_ok: np.ndarray | None, exact: np.ndarray | None,
                          tk: int, m: int, n: int, bounds: tuple[np.ndarray, ...]) -> None:
    """Every row that sees a key of block ``j`` is in ``[q_lo, q_hi)``; every row of ``[full_lo, full_hi)`` sees
    the whole block; the block's flag is 1 only where every row that may see it is exact."""
    q_lo, q_hi, full_lo, full_hi, flags = (np.asarray(b) for b in bounds)
    rows = np.arange(lo.shape[0])
    for j in range(-(-tk // n)):
        start = j * n
        sees = (lo < min(start + n, tk)) & (hi > start) & (hi > lo)
        if ids_ok is not None:  # a visible key of the row's own id
            sees &= ids_ok[:, start:start + n].any(axis=1)
        assert q_lo[j] % m == 0
        assert np.all((rows[sees] >= q_lo[j]) & (rows[sees] < q_hi[j])), j
        whole = rows[full_lo[j]:full_hi[j]]
        assert np.all((lo[whole] <= start) & (hi[whole] >= start + n)), j
        if exact is not None and flags[j]:
            assert np.all(exact[q_lo[j]:max(q_hi[j], q_lo[j])] == 1), j


@pytest.mark.parametrize(("lens", "pad", "causal", "window"), [
    ((5, 0, 20, 1), 3, True, None),  # an empty sequence, sequences shorter than a block, a padding tail
    ((16, 32, 7), 0, False, None),  # block-aligned sequences, then a ragged last one
    ((40, 3, 33), 9, True, (5, 2)),  # a window: rows see a band inside their sequence
])
def test_key_block_rows_cover_the_rows_that_see_each_block(lens: tuple[int, ...], pad: int, causal: bool,
                                                          window: tuple[int, int] | None) -> None:
    from ejk.plugin import varlen_row_ranges
    from ejk_triton._varlen_attention import key_block_rows

    tq = tk = sum(lens) + pad
    cu = jnp.asarray(np.cumsum([0, *lens]), jnp.int32)
    lo, hi = jax.jit(functools.partial(varlen_row_ranges, q_tokens=tq, k_tokens=tk, causal=causal,
                                       sliding_window=window))(cu, cu)
    for m, n in ((16, 32), (32, 16)):
        bounds = jax.jit(key_block_rows, static_argnums=(7, 8, 9))(lo, hi, lo, hi, lo, hi, None, tk, m, n)
        assert np.all(np.asarray(bounds[4]) == 1)  # no segment ids: every block's rows are exact
        _check_key_block_rows(np.asarray(lo), np.asarray(hi), None, None, tk, m, n, bounds)


def _ids(pattern: list[tuple[int, int]]) -> np.ndarray:
    return np.concatenate([np.full(count, value, np.int32) for value, count in pattern])


@pytest.mark.parametrize(("q_pattern", "k_pattern", "causal", "window"), [
    ([(0, 10), (1, 20), (0, 6), (2, 60)], None, True, None),  # id 0 in two runs: inexact; 1 and 2 exact
    ([(3, 16), (1, 16), (7, 32)], None, False, None),  # contiguous segments: all exact
    ([(0, 9), (1, 14)], [(1, 5), (0, 12), (5, 4)], True, (3, 0)),  # Sq != Sk, a key id no row has
    ([(2, 4), (0, 3), (2, 5), (0, 20)], None, False, (4, 4)),  # interleaved runs inside a window
    ([(2, 4), (22, 3), (5, 3)], [(2, 3), (12, 4), (-2**31, 2), (2**31 - 1, 1)], True, None),  # ids 2, 12 and 22
    # share a bucket (mod 10), 22 has no key; the extreme ids
])
def test_segment_intervals_against_brute_force(q_pattern: list[tuple[int, int]], k_pattern: Any, causal: bool,
                                               window: tuple[int, int] | None) -> None:
    from ejk_triton._segment_attention import segment_intervals
    from ejk_triton._varlen_attention import inexact_prefix, key_block_rows

    q_ids = _ids(q_pattern)
    k_ids = q_ids if k_pattern is None else _ids(k_pattern)
    sq, sk = q_ids.shape[0], k_ids.shape[0]
    got = jax.jit(functools.partial(segment_intervals, causal=causal, sliding_window=window))(
        jnp.asarray(q_ids)[None], jnp.asarray(k_ids)[None])
    lo, hi, hull_lo, hull_hi, inner_lo, inner_hi, exact = (np.asarray(x) for x in got)
    pos = np.arange(sq)[:, None] + sk - sq
    cols = np.arange(sk)[None, :]
    visible = q_ids[:, None] == k_ids[None, :]
    if window is not None:
        visible &= (cols >= pos - window[0]) & (cols <= pos + window[1])
    elif causal:
        visible &= cols <= pos
    inside = (cols >= lo[:, None]) & (cols < hi[:, None])
    assert np.all(inside[visible]), "a visible key outside its row's interval"
    assert np.all(np.diff(hull_lo) >= 0) and np.all(np.diff(hull_hi) >= 0)
    assert np.all(np.diff(inner_lo) >= 0) and np.all(np.diff(inner_hi) >= 0)
    assert np.all((hull_lo <= lo) & (hull_hi >= hi) & (inner_lo >= lo) & (inner_hi <= hi))
    same_id = q_ids[:, None] == k_ids[None, :]
    want_exact = np.all(same_id | ~inside, axis=1)  # every key of the interval carries the row's id
    assert np.all(want_exact[exact == 1]), "a row flagged exact sees another id inside its interval"
    if k_pattern is None and all(v not in [u for u, _ in q_pattern[:i]] for i, (v, _) in enumerate(q_pattern)):
        assert np.all(exact == 1)  # contiguous segments: every row exact
    bounds = jax.jit(key_block_rows, static_argnums=(7, 8, 9))(lo, hi, hull_lo, hull_hi, inner_lo, inner_hi,
                                                               inexact_prefix(jnp.asarray(exact)), sk, 16, 32)
    _check_key_block_rows(lo, hi, same_id & inside, exact, sk, 16, 32, bounds)


def test_segments_mixing_exact_and_inexact_blocks() -> None:
    # Id 0 comes back after id 1: its rows (and the key blocks they see) compare ids everywhere, while the long
    # contiguous id 2 has an interior block that compares none; against the float64 reference, values and grads.
    ids = jnp.asarray(_ids([(0, 5), (1, 11), (0, 3), (2, 45)]))[None]
    rng = np.random.default_rng(7)
    q, k, v, ct = (jnp.asarray(rng.standard_normal((1, 64, 1, 16)), jnp.float32) for _ in range(4))
    options = dict(causal=True, q_segment_ids=ids, kv_segment_ids=ids)

    def run(fn: Any) -> Any:
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **options), q, k, v)
        return out, vjp(ct)

    got, got_g = jax.jit(lambda: run(lambda *a, **kw: ejk.flash_attention(*a, **kw, platform="triton", cfg=SEGMENTS)))()
    want, want_g = jax.jit(lambda: run(reference_flash_attention))()
    assert_close(got, want, jnp.float32, what="out")
    for name, a, w in zip(("dq", "dk", "dv"), got_g, want_g, strict=True):
        assert_close(a, w, jnp.float32, what=name)
