"""flash_attention with segment ids on cuDNN's packed segments: the runs and their check, the cond and its
fallback on a CPU (cuDNN emulated, conftest.py), numerics on a GPU (marker ``gpu``)."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, compare, reference_flash_attention
from ejk_xla import _cudnn_attention, _cudnn_segments
from ejk_xla._cudnn_segments import run_segments

BF16 = jnp.bfloat16


def _runs(q_ids: list[list[int]], kv_ids: list[list[int]] | None = None) -> tuple[list[list[list[int]]], bool]:
    q = jnp.asarray(q_ids, jnp.int32)
    kv = q if kv_ids is None else jnp.asarray(kv_ids, jnp.int32)
    segments, fits = run_segments(q, kv)
    return [np.asarray(x).tolist() for x in segments], bool(fits)


def test_runs_are_segments() -> None:
    (q_len, k_len, q_off, k_off), fits = _runs([[3, 3, 3, 5, 5, 0], [1, 1, 1, 1, 1, 1]])
    assert q_len == k_len == [[3, 2, 1, -1, -1, -1], [6, -1, -1, -1, -1, -1]]
    assert q_off == k_off == [[0, 3, 5, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1, -1]]
    assert fits  # padding id 0 after the documents: a run of its own


@pytest.mark.parametrize(("q_ids", "kv_ids"), [
    ([[1, 1, 2, 2, 1, 1]], None),  # id 1 in two runs: its tokens see each other across id 2
    ([[1, 1, 2, 2, 3, 3]], [[1, 1, 2, 2, 2, 3]]),  # keys differ from queries
    ([[1, 2, 1, 2], [4, 4, 4, 4]], None),  # one row repeats its ids, the other is fine
])
def test_runs_that_are_not_the_mask_do_not_fit(q_ids: list[list[int]], kv_ids: list[list[int]] | None) -> None:
    assert not _runs(q_ids, kv_ids)[1]


def test_more_runs_than_slots_do_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cudnn_segments, "MAX_RUNS", 3)
    (q_len, *_), fits = _runs([[0, 1, 2, 2, 2, 2]])
    assert q_len == [[1, 1, 4]] and fits
    assert not _runs([[0, 1, 2, 3, 3, 3]])[1]


def _call(q: jax.Array, k: jax.Array, v: jax.Array, ids: jax.Array, kv_ids: jax.Array | None = None,
          **options: Any) -> jax.Array:
    static = {"causal": False, "softmax_scale": 0.25, "sliding_window": None, **options}
    return _cudnn_attention.cudnn_attention(q, k, v, logits_soft_cap=None, q_segment_ids=ids,
                                            kv_segment_ids=ids if kv_ids is None else kv_ids, bias=None, **static)


EMULATED = [  # (ids per row, Hq, Hkv, options)
    pytest.param(([[1, 1, 1, 2, 2, 2, 2, 0], [5, 5, 5, 5, 5, 6, 6, 6]], 4, 2, {"causal": True}), id="causal-gqa2"),
    pytest.param(([[1, 1, 1, 2, 2, 2, 2, 2]], 2, 2, {"sliding_window": (1, 0)}), id="window"),
    pytest.param(([[1, 1, 2, 2, 2, 3, 3, 3]], 4, 1, {}), id="full-gqa4"),
    pytest.param(([[1, 1, 2, 2, 1, 1, 3, 3]], 2, 2, {"causal": True}), id="repeated-id-fallback"),
]


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("case", EMULATED)
def test_emulated_cudnn_segments_match_the_reference(case: Any) -> None:
    ids_rows, hq, hkv, options = case
    ids = jnp.asarray(ids_rows, jnp.int32)
    batch, seq = ids.shape
    keys = jax.random.split(jax.random.key(2), 4)
    q = jax.random.normal(keys[0], (batch, seq, hq, 16))
    k, v = (jax.random.normal(key, (batch, seq, hkv, 16)) for key in keys[1:3])
    cotangent = jax.random.normal(keys[3], q.shape)
    compare(lambda q, k, v: _call(q, k, v, ids, **options),
            lambda q, k, v: reference_flash_attention(q, k, v, softmax_scale=0.25, q_segment_ids=ids,
                                                      kv_segment_ids=ids, **options),
            (q, k, v), jnp.float32, cotangent=cotangent)


@pytest.mark.usefixtures("emulated")
def test_emulated_different_key_ids_take_the_fallback() -> None:
    q_ids = jnp.asarray([[1, 1, 2, 2, 3, 3]], jnp.int32)
    kv_ids = jnp.asarray([[1, 2, 2, 2, 3, 3]], jnp.int32)
    q = jax.random.normal(jax.random.key(0), (1, 6, 2, 16))
    got = _call(q, q, q, q_ids, kv_ids, causal=True)
    want = reference_flash_attention(q, q, q, causal=True, softmax_scale=0.25, q_segment_ids=q_ids,
                                     kv_segment_ids=kv_ids)
    assert_close(got, want, jnp.float32)


@pytest.mark.usefixtures("emulated")
def test_emulated_cudnn_segments_under_vmap() -> None:
    """Microbatches through jax.vmap: one row's ids are runs, the other's repeat an id (the fallback)."""
    ids = jnp.asarray([[[1, 1, 2, 2, 2, 0]], [[1, 2, 2, 1, 3, 3]]], jnp.int32)
    q = jax.random.normal(jax.random.key(4), (2, 1, 6, 2, 16))

    def ours(q: jax.Array, ids: jax.Array) -> jax.Array:
        return _call(q, q, q, ids, causal=True)

    def ref(q: jax.Array, ids: jax.Array) -> jax.Array:
        return reference_flash_attention(q, q, q, causal=True, softmax_scale=0.25, q_segment_ids=ids,
                                         kv_segment_ids=ids)

    @partial(jax.jit, static_argnums=0)
    def values_and_grad(fn: Any, q: jax.Array) -> Any:
        return jax.vmap(fn)(q, ids), jax.grad(lambda q: jnp.sum(jnp.sin(jax.vmap(fn)(q, ids))))(q)

    got, want = values_and_grad(ours, q), values_and_grad(ref, q)
    assert_close(got[0], want[0], jnp.float32)
    assert_close(got[1], want[1], jnp.float32, what="dq")


# -- numerics on the GPU --------------------------------------------------------------------------------------

def _doc_ids(batch: int, lengths: list[int]) -> jax.Array:
    """Each row: documents of ``lengths`` tokens (ids 1, 2, ...), the rest padding with id 0."""
    row = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])
    return jnp.asarray(np.broadcast_to(row, (batch, row.size)), jnp.int32)


GPU_CASES = [
    # (batch, document lengths, Hq, Hkv, D, options)
    (2, [300, 500, 100, 124], 8, 8, 128, {"causal": True}),
    (1, [1000, 24], 8, 2, 128, {"causal": True, "sliding_window": (64, 0)}),
    (2, [128, 256, 128], 4, 1, 64, {}),
    (1, [2, 510], 8, 4, 128, {"causal": True}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", GPU_CASES)
def test_cudnn_segments_match_the_reference_on_gpu(case: Any, dtype: Any) -> None:
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    batch, lengths, hq, hkv, d, options = case
    ids = _doc_ids(batch, lengths)
    ids = ids.at[:, -7:].set(0)  # a padding tail of id 0
    seq = ids.shape[1]
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (batch, seq, hq, d), dtype)
    k, v = (jax.random.normal(key, (batch, seq, hkv, d), dtype) for key in keys[1:3])
    found = ejk.explain("flash_attention", q, k, v, q_segment_ids=ids, kv_segment_ids=ids, platform="xla", **options)
    assert found.chosen is not None and found.chosen.implementation == "cudnn", found

    def ours(q: Any, k: Any, v: Any) -> Any:
        return ejk.flash_attention(q, k, v, q_segment_ids=ids, kv_segment_ids=ids, platform="xla", **options)

    def ref(q: Any, k: Any, v: Any) -> Any:
        return reference_flash_attention(q, k, v, q_segment_ids=ids, kv_segment_ids=ids, **options)

    cotangent = jax.random.normal(keys[3], q.shape, dtype)
    compare(ours, ref, (q, k, v), dtype, cotangent=cotangent)


@pytest.mark.gpu
def test_cudnn_segments_with_a_repeated_id_fall_back_on_gpu() -> None:
    if jax.default_backend() != "gpu":
        pytest.skip("needs an NVIDIA GPU")
    ids = jnp.asarray(np.repeat([1, 2, 1, 3], 64)[None], jnp.int32)  # id 1 in two runs
    q = jax.random.normal(jax.random.key(0), (1, 256, 4, 128), BF16)
    options = {"causal": True, "q_segment_ids": ids, "kv_segment_ids": ids}
    compare(lambda q: ejk.flash_attention(q, q, q, platform="xla", **options),
            lambda q: reference_flash_attention(q, q, q, **options), (q,), BF16)
