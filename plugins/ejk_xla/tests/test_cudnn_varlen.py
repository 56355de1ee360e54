"""Packed cuDNN varlen attention: segments, gate and the cond / VJP plumbing on a CPU (cuDNN emulated),
numerics against the reference on a GPU (marker ``gpu``)."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, compare
from ejk_xla import _cudnn_packed, _cudnn_varlen
from ejk_xla._cudnn_varlen import packed_segments, shape_problem

BF16 = jnp.bfloat16


# -- cuDNN's segments -----------------------------------------------------------------------------------

def _segments(cu_q: list[int], cu_k: list[int], masked: bool) -> tuple[list[list[int]], bool]:
    segments, fits = packed_segments(jnp.asarray(cu_q, jnp.int32), jnp.asarray(cu_k, jnp.int32), masked=masked)
    return [np.asarray(s).tolist() for s in segments], bool(fits)


def test_segments_of_equal_lengths() -> None:
    (q_len, k_len, q_off, k_off), fits = _segments([0, 3, 8, 9], [0, 3, 8, 9], masked=True)
    assert q_len == k_len == [[3, 5, 1]]
    assert q_off == k_off == [[0, 3, 8, -1]]
    assert fits


def test_one_sequence_is_two_segments() -> None:
    """jax takes the packed layout only for more than one segment per row: N = 1 gains an empty one."""
    (q_len, k_len, q_off, k_off), fits = _segments([0, 5], [0, 7], masked=False)
    assert (q_len, k_len, q_off, k_off) == ([[5, -1]], [[7, -1]], [[0, -1, -1]], [[0, -1, -1]])
    assert fits


def test_sequences_without_queries_or_keys_are_no_segment() -> None:
    (q_len, k_len, q_off, k_off), _ = _segments([0, 0, 4, 4, 6], [0, 2, 2, 5, 9], masked=False)
    assert q_len == [[-1, -1, -1, 2]] and k_len == [[-1, -1, -1, 4]]
    assert q_off == [[-1, -1, -1, 4, -1]] and k_off == [[-1, -1, -1, 5, -1]]


def test_masked_sequences_with_more_queries_start_late() -> None:
    """Bottom-right alignment: the first Sq - Sk rows see no key, the rest is top-left aligned."""
    (q_len, k_len, q_off, k_off), fits = _segments([0, 6, 10], [0, 2, 6], masked=True)
    assert q_len == [[2, 4]] and k_len == [[2, 4]]
    assert q_off == [[4, 6, -1]] and k_off == [[0, 2, -1]]
    assert fits


def test_unmasked_sequences_keep_every_row() -> None:
    (q_len, _, q_off, _), fits = _segments([0, 6, 10], [0, 2, 6], masked=False)
    assert q_len == [[6, 4]] and q_off == [[0, 6, -1]] and fits


@pytest.mark.parametrize(("cu_q", "cu_k", "fits"), [
    ([0, 2, 6], [0, 3, 6], False),  # the first sequence has more keys than queries
    ([0, 0, 6], [0, 3, 6], True),  # ... but no queries: no segment
    ([0, 2, 6], [0, 2, 6], True),
    ([0, 3, 6], [0, 2, 6], False),  # the second has 3 queries, 4 keys
])
def test_fits_only_when_every_masked_sequence_has_enough_queries(cu_q: list[int], cu_k: list[int],
                                                                   fits: bool) -> None:
    assert _segments(cu_q, cu_k, masked=True)[1] is fits
    assert _segments(cu_q, cu_k, masked=False)[1] is True


def test_segments_are_traced() -> None:
    """One trace serves every packing (the offsets stay arrays)."""
    traces = []

    @jax.jit
    def run(cu_q: jax.Array, cu_k: jax.Array) -> Any:
        traces.append(1)
        return packed_segments(cu_q, cu_k, masked=True)

    for cu in ([0, 1, 9], [0, 4, 9], [0, 9, 9]):
        run(jnp.asarray(cu, jnp.int32), jnp.asarray(cu, jnp.int32))
    assert len(traces) == 1


# -- the capability gate ----------------------------------------------------------------------------------

def _sds(shape: tuple[int, ...], dtype: Any = BF16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _call(tq: int = 4096, hq: int = 16, tk: int | None = None, hkv: int | None = None, d: int = 128,
          dv: int | None = None, seqs: int = 16, dtype: Any = BF16, **options: Any) -> dict[str, Any]:
    tk = tq if tk is None else tk
    hkv = hq if hkv is None else hkv
    call: dict[str, Any] = {
        "q": _sds((tq, hq, d), dtype), "k": _sds((tk, hkv, d), dtype),
        "v": _sds((tk, hkv, d if dv is None else dv), dtype),
        "cu_seqlens_q": _sds((seqs + 1,), jnp.int32), "cu_seqlens_k": _sds((seqs + 1,), jnp.int32),
        "sinks": None, "causal": False, "softmax_scale": 0.1, "sliding_window": None, "logits_soft_cap": None,
        "max_seqlen_q": None, "max_seqlen_k": None, "precision": "default",
    }
    call.update(options)
    return call


ACCEPTED = [
    pytest.param(_call(causal=True), id="causal"),
    pytest.param(_call(), id="full"),
    pytest.param(_call(hkv=4, causal=True), id="gqa"),
    pytest.param(_call(dtype=jnp.float16, d=64), id="fp16-d64"),
    pytest.param(_call(d=256, seqs=1), id="d256-one-sequence"),
    pytest.param(_call(tq=4095, tk=4095, causal=True), id="odd-rows"),
    pytest.param(_call(tq=64, tk=4096), id="full-tq-lt-tk"),
    pytest.param(_call(tq=4096, tk=1024, causal=True), id="causal-tq-gt-tk"),
    pytest.param(_call(causal=True, sliding_window=(128, 0)), id="causal-window"),
    pytest.param(_call(sliding_window=(128, 0)), id="left-window"),
    pytest.param(_call(tq=32768, seqs=512), id="512-sequences-of-64"),
]

REFUSED = [
    pytest.param(_call(dtype=jnp.float32), "float32 not supported", id="float32"),
    pytest.param(_call(d=100), "head_dim 100", id="d-not-multiple-of-8"),
    pytest.param(_call(d=512), "head_dim 512", id="d-too-large"),
    pytest.param(_call(dv=64), "v head dim 64", id="dv-ne-d"),
    pytest.param(_call(logits_soft_cap=30.0), "soft cap not supported", id="soft-cap"),
    pytest.param(_call(sinks=_sds((16,), jnp.float32)), "sinks not supported", id="sinks"),
    pytest.param(_call(sliding_window=(8, 8)), "right reach", id="right-window"),
    pytest.param(_call(tq=1024, tk=4096, causal=True), "Tq=1024 < Tk=4096", id="causal-tq-lt-tk"),
    pytest.param(_call(tq=1024, tk=4096, sliding_window=(8, 0)), "top-left", id="window-tq-lt-tk"),
    pytest.param(_call(seqs=0), "no sequences", id="no-sequences"),
    pytest.param(_call(tq=0), "empty arrays", id="no-queries"),
    pytest.param(_call(tk=0), "empty arrays", id="no-keys"),
    pytest.param(_call(tq=32768, seqs=1024), "softmax statistics", id="too-many-sequences"),
]


@pytest.mark.parametrize("call", ACCEPTED)
def test_gate_accepts_what_cudnn_runs(call: dict[str, Any]) -> None:
    assert shape_problem(**call) is None


@pytest.mark.parametrize(("call", "reason"), REFUSED)
def test_gate_refuses_with_a_reason(call: dict[str, Any], reason: str) -> None:
    problem = shape_problem(**call)
    assert problem is not None and reason in problem


def test_gate_head_dim_limit() -> None:
    assert shape_problem(**_call(d=256), max_head_dim=128) is not None


def test_this_jax_has_the_packed_api() -> None:
    assert _cudnn_packed.api_problem() is None


def test_cpu_calls_never_reach_cudnn() -> None:
    if jax.default_backend() == "gpu":
        pytest.skip("checks the CPU path")
    q = jnp.ones((8, 2, 16), BF16)
    cu = jnp.asarray([0, 3, 8], jnp.int32)
    found = ejk.explain("flash_attention_varlen", q, q, q, cu, cu, causal=True)
    (cudnn,) = [r for r in found.implementations if r.label == "xla/gpu:cudnn"]
    assert cudnn.status == "refused"
    assert found.chosen is not None and found.chosen.implementation != "cudnn"


# -- the implementation around cuDNN, on a CPU: cuDNN's packed attention emulated (conftest.py) -------------

def _inputs(lens_q: list[int], lens_k: list[int], hq: int, hkv: int, d: int = 16, dtype: Any = jnp.float32,
            tail_q: int = 0, tail_k: int = 0) -> tuple[jax.Array, ...]:
    tq, tk = sum(lens_q) + tail_q, sum(lens_k) + tail_k
    keys = jax.random.split(jax.random.key(3), 3)
    return (jax.random.normal(keys[0], (tq, hq, d), dtype), jax.random.normal(keys[1], (tk, hkv, d), dtype),
            jax.random.normal(keys[2], (tk, hkv, d), dtype), jnp.asarray(np.cumsum([0, *lens_q]), jnp.int32),
            jnp.asarray(np.cumsum([0, *lens_k]), jnp.int32))


def _check_against_reference(args: tuple[jax.Array, ...], dtype: Any, **options: Any) -> None:
    q, k, v, cu_q, cu_k = args
    static = {"sinks": None, "causal": False, "softmax_scale": 0.25, "sliding_window": None,
              "logits_soft_cap": None, "max_seqlen_q": None, "max_seqlen_k": None, "precision": "default",
              **options}

    def ours(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return _cudnn_varlen.cudnn_varlen_attention(q, k, v, cu_q, cu_k, **static)

    def ref(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ejk.testing.reference_flash_attention_varlen(
            q, k, v, cu_q, cu_k, causal=static["causal"], softmax_scale=0.25, sliding_window=static["sliding_window"])

    cotangent = jax.random.normal(jax.random.key(1), q.shape[:2] + v.shape[2:], dtype)
    compare(ours, ref, (q, k, v), dtype, cotangent=cotangent)


EMULATED = [  # (q lengths, k lengths, Hq, Hkv, (q padding tail, k padding tail), options)
    pytest.param(([3, 5, 1], [3, 5, 1], 4, 4, (0, 0), {"causal": True}), id="causal-equal"),
    pytest.param(([3, 5, 1], [3, 5, 1], 4, 2, (3, 3), {"causal": True, "sliding_window": (2, 0)}), id="window-gqa2"),
    pytest.param(([4, 0, 3], [2, 3, 3], 4, 1, (1, 2), {}), id="full-empty-gqa4"),
    pytest.param(([6, 3], [2, 3], 2, 2, (2, 0), {"causal": True}), id="causal-more-queries"),
    pytest.param(([2, 5], [3, 5], 2, 2, (1, 0), {"causal": True}), id="causal-fallback"),
    pytest.param(([2, 5], [3, 5], 2, 1, (0, 0), {"sliding_window": (1, 0)}), id="window-fallback"),
    pytest.param(([5], [7], 2, 2, (0, 3), {}), id="one-sequence"),
    pytest.param(([3, 2], [0, 2], 2, 2, (0, 0), {"causal": True}), id="no-keys"),
]


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("case", EMULATED)
def test_emulated_cudnn_matches_the_reference(case: Any) -> None:
    lens_q, lens_k, hq, hkv, (tail_q, tail_k), options = case
    _check_against_reference(_inputs(lens_q, lens_k, hq, hkv, tail_q=tail_q, tail_k=tail_k), jnp.float32, **options)


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("batched_offsets", [False, True], ids=["shared-offsets", "offsets-per-element"])
def test_emulated_cudnn_under_vmap(batched_offsets: bool) -> None:
    """jax.vmap loops over cuDNN calls (the emulation refuses to be batched), values and gradients exact."""
    static = {"sinks": None, "causal": True, "softmax_scale": 0.25, "sliding_window": None, "logits_soft_cap": None,
              "max_seqlen_q": None, "max_seqlen_k": None, "precision": "default"}
    keys = jax.random.split(jax.random.key(5), 3)
    q, k, v = (jax.random.normal(key, (2, 9, 2, 16)) for key in keys)
    cu = jnp.asarray([[0, 4, 9], [0, 2, 9]] if batched_offsets else [0, 4, 9], jnp.int32)
    cu_k = jnp.asarray([[0, 4, 9], [0, 3, 9]] if batched_offsets else [0, 4, 9], jnp.int32)  # the 2nd: fallback
    axes = (0, 0, 0, 0 if batched_offsets else None, 0 if batched_offsets else None)

    def ours(q: jax.Array, k: jax.Array, v: jax.Array, cu: jax.Array, cu_k: jax.Array) -> jax.Array:
        return _cudnn_varlen.cudnn_varlen_attention(q, k, v, cu, cu_k, **static)

    def ref(q: jax.Array, k: jax.Array, v: jax.Array, cu: jax.Array, cu_k: jax.Array) -> jax.Array:
        return ejk.testing.reference_flash_attention_varlen(q, k, v, cu, cu_k, causal=True, softmax_scale=0.25)

    @partial(jax.jit, static_argnums=0)
    def values_and_grads(fn: Any, q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        batched = jax.vmap(fn, in_axes=axes)
        grads = jax.grad(lambda q, k, v: jnp.sum(jnp.sin(batched(q, k, v, cu, cu_k))), argnums=(0, 1, 2))(q, k, v)
        return batched(q, k, v, cu, cu_k), grads

    got, want = values_and_grads(ours, q, k, v), values_and_grads(ref, q, k, v)
    assert_close(got[0], want[0], jnp.float32)
    for name, g, w in zip("qkv", got[1], want[1], strict=True):
        assert_close(g, w, jnp.float32, what=f"d{name}")


@pytest.mark.usefixtures("emulated")
def test_the_fast_branch_keeps_only_cudnns_own_residuals() -> None:
    """q, k, v and the output are not carried through the cond: only cuDNN's statistics and segments."""
    q, k, v, cu_q, cu_k = _inputs([3, 5], [3, 5], 2, 2)
    plan = _cudnn_varlen._Plan(scale=0.25, masked=True, window_length=None, causal=True, sliding_window=None,
                               q_tokens=8, k_tokens=8)
    segments, fits = packed_segments(cu_q, cu_k, masked=True)
    out, residuals = _cudnn_packed._guarded_fwd(plan, q[None], k[None], v[None], (cu_q, cu_k), segments, fits)
    saved = residuals[-1]
    assert saved.slots.count(None) == len(saved.kept) and {0, 1, 2, 3} <= set(saved.slots)
    assert sorted(x.shape for x in saved.kept) == [(1, 2), (1, 2), (1, 2, 8), (1, 3), (1, 3)]
    assert residuals[5] is out


# -- numerics on the GPU --------------------------------------------------------------------------------------

GPU_CASES = [
    # (q lengths, k lengths, q padding tail, k padding tail, Hq, Hkv, D, options)
    ([512, 1024, 512], [512, 1024, 512], 0, 0, 8, 8, 128, {"causal": True}),
    ([255, 1, 700, 0, 97], [255, 1, 700, 0, 97], 13, 13, 8, 4, 128, {"causal": True}),
    ([300, 211, 64], [300, 211, 64], 0, 0, 8, 2, 64, {"causal": True, "sliding_window": (48, 0)}),
    ([300, 211, 64], [200, 500, 64], 7, 0, 4, 1, 128, {}),
    ([129, 0, 300], [77, 50, 300], 0, 9, 8, 8, 128, {}),
    ([64, 30, 100], [64, 0, 100], 6, 0, 8, 2, 128, {}),  # queries without keys: zeros
    ([400, 96], [400, 96], 0, 0, 4, 4, 256, {"sliding_window": (31, 0)}),
    ([640, 384], [512, 384], 0, 0, 8, 4, 128, {"causal": True}),  # Sq > Sk: the first rows see nothing
    ([1000], [1000], 0, 0, 8, 8, 128, {"causal": True}),  # one sequence
]


def _gpu_inputs(lens_q: list[int], lens_k: list[int], tail_q: int, tail_k: int, hq: int, hkv: int, d: int,
                dtype: Any) -> tuple[jax.Array, ...]:
    return _inputs(lens_q, lens_k, hq, hkv, d, dtype, tail_q, tail_k)


def _poison_device_memory(nbytes: int) -> None:
    """Fill and free device memory with NaNs so that rows cuDNN leaves unwritten would show."""
    junk = jnp.full((nbytes // 4,), jnp.nan, jnp.float32)
    junk.block_until_ready()
    del junk


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", GPU_CASES)
def test_cudnn_varlen_matches_the_reference_on_gpu(case: Any, dtype: Any) -> None:
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    lens_q, lens_k, tail_q, tail_k, hq, hkv, d, options = case
    q, k, v, cu_q, cu_k = _gpu_inputs(lens_q, lens_k, tail_q, tail_k, hq, hkv, d, dtype)
    found = ejk.explain("flash_attention_varlen", q, k, v, cu_q, cu_k, platform="xla", **options)
    assert found.chosen is not None and found.chosen.implementation == "cudnn", found

    def ours(q: Any, k: Any, v: Any) -> Any:
        return ejk.flash_attention_varlen(q, k, v, cu_q, cu_k, platform="xla", **options)

    def ref(q: Any, k: Any, v: Any) -> Any:
        return ejk.testing.reference_flash_attention_varlen(q, k, v, cu_q, cu_k, **options)

    cotangent = jax.random.normal(jax.random.key(1), q.shape[:2] + v.shape[2:], dtype)
    _poison_device_memory(64 * q.size * q.dtype.itemsize)
    compare(ours, ref, (q, k, v), dtype, cotangent=cotangent)


@pytest.mark.gpu
def test_cudnn_varlen_fallback_for_more_keys_on_gpu() -> None:
    """Tq == Tk but one sequence has more keys than queries (causal): the chunked branch, exact values."""
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    q, k, v, cu_q, cu_k = _gpu_inputs([200, 312], [256, 256], 0, 0, 4, 2, 128, BF16)
    found = ejk.explain("flash_attention_varlen", q, k, v, cu_q, cu_k, platform="xla", causal=True)
    assert found.chosen is not None and found.chosen.implementation == "cudnn", found
    compare(lambda q, k, v: ejk.flash_attention_varlen(q, k, v, cu_q, cu_k, platform="xla", causal=True),
            lambda q, k, v: ejk.testing.reference_flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True),
            (q, k, v), BF16)


@pytest.mark.gpu
def test_cudnn_varlen_new_packing_reuses_the_program_on_gpu() -> None:
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    q, k, v, cu, _ = _gpu_inputs([256, 256], [256, 256], 0, 0, 4, 4, 128, BF16)
    traces = []

    @jax.jit
    def run(cu: jax.Array) -> jax.Array:
        traces.append(1)
        return ejk.flash_attention_varlen(q, k, v, cu, cu, causal=True, platform="xla")

    for lens in ([256, 256], [100, 412], [512, 0]):
        cu = jnp.asarray(np.cumsum([0, *lens]), jnp.int32)
        assert_close(run(cu), ejk.testing.reference_flash_attention_varlen(q, k, v, cu, cu, causal=True), BF16)
    assert len(traces) == 1


@pytest.mark.gpu
def test_packed_cudnn_with_fewer_kv_heads_on_gpu() -> None:
    """jax's packed cuDNN call places the key segments right with fewer k / v heads than q's (passed on an H100,
    jax 0.11.2, forward): the repeat of k / v heads in ``_cudnn_varlen.prepare`` may go once the backward is
    checked the same way."""
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    q, k, v, cu, _ = _gpu_inputs([200, 312], [200, 312], 0, 0, 8, 2, 128, BF16)
    segments, _ = packed_segments(cu, cu, masked=False)
    out = _cudnn_packed.packed_attention(q[None], k[None], v[None], segments, scale=128**-0.5, masked=False,
                                         window_length=None)
    assert_close(out[0], ejk.testing.reference_flash_attention_varlen(q, k, v, cu, cu), BF16)
