"""The XLA varlen attention: float64 per-sequence references (values and gradients), the conformance
check, no retrace for a new packing, offsets wrong only at run time."""

from __future__ import annotations

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
    reference_flash_attention_varlen,
)
from ejk_xla import VarlenAttentionConfig

pytestmark = pytest.mark.filterwarnings("error")

#: Small blocks: sequences straddle blocks, and blocks hold several sequences.
SMALL = VarlenAttentionConfig(block_q=8, block_k=8)

CASES = [
    pytest.param({"q_lens": (5, 11, 1, 7), "k_lens": (5, 11, 1, 7), "heads": (2, 2), "dim": 8}, id="odd-mha"),
    pytest.param({"q_lens": (9, 0, 6), "k_lens": (9, 0, 6), "pad": 5, "heads": (4, 2), "dim": 8, "causal": True},
                 id="empty-pad-gqa2"),
    pytest.param({"q_lens": (3, 12), "k_lens": (7, 9), "heads": (8, 2), "dim": 8, "causal": True}, id="sq!=sk-gqa4"),
    pytest.param({"q_lens": (10, 4), "k_lens": (10, 0), "pad": 2, "heads": (8, 1), "dim": 16,
                  "sliding_window": (2, 3)}, id="empty-keys-window-gqa8"),
    pytest.param({"q_lens": (13, 6), "k_lens": (9, 6), "heads": (4, 4), "dim": 8, "causal": True,
                  "sliding_window": 3, "sinks": True}, id="window-sinks"),
    pytest.param({"q_lens": (6, 9), "k_lens": (6, 9), "pad": 3, "heads": (4, 1), "dim": 8, "logits_soft_cap": 4.0,
                  "sinks": True}, id="cap-sinks-pad"),
]


@pytest.mark.parametrize("case", CASES)
def test_against_float64_reference(case: dict[str, Any]) -> None:
    check_varlen_against_float64("xla", case, jnp.float32, cfg=SMALL)


def test_conformance_check_small_blocks() -> None:
    assert check_flash_attention_varlen("xla", dtypes=(jnp.bfloat16,), cfg=SMALL) == 6


def test_heuristic_blocks_conformance() -> None:
    assert check_flash_attention_varlen("xla", dtypes=(jnp.float32,), grads=False, cases=VARLEN_CASES[::3]) == 2


def _packing(lens: list[int], total: int) -> jax.Array:
    assert sum(lens) <= total
    return jnp.asarray(np.cumsum([0, *lens]), jnp.int32)


def test_a_new_packing_neither_retraces_nor_recompiles() -> None:
    traces = []
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((24, 2, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((24, 1, 8)), jnp.float32)

    @jax.jit
    def loss(q: jax.Array, k: jax.Array, cu_q: jax.Array, cu_k: jax.Array) -> jax.Array:
        traces.append(1)
        out = ejk.flash_attention_varlen(q, k, k, cu_q, cu_k, causal=True, platform="xla", cfg=SMALL)
        return jnp.sum(out * out)

    grad = jax.jit(jax.grad(loss.__wrapped__))  # type: ignore[attr-defined]
    for lens in ([24], [5, 7, 12], [1, 0, 20], [3, 3, 3, 3, 3, 3, 3]):  # every packing has 8 offsets after padding
        cu = _packing(lens + [0] * (8 - len(lens) - 1), 24)
        loss(q, k, cu, cu)
        grad(q, k, cu, cu)
        want = reference_flash_attention_varlen(q, k, k, cu, cu, causal=True)
        got = ejk.flash_attention_varlen(q, k, k, cu, cu, causal=True, platform="xla", cfg=SMALL)
        assert_close(got, want, jnp.float32)
    assert len(traces) == 2  # one trace for loss, one for its gradient
    assert loss._cache_size() == 1 and grad._cache_size() == 1


def test_offsets_wrong_only_at_run_time_are_clamped_and_made_non_decreasing() -> None:
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((12, 2, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((10, 2, 8)), jnp.float32)
    run = jax.jit(lambda cu_q, cu_k: ejk.flash_attention_varlen(q, k, k, cu_q, cu_k, platform="xla", cfg=SMALL))
    # Decreasing (sequence 1 is empty: its end repeats 6), past the end (clamped to T), and a start above 0.
    got = run(jnp.asarray([0, 6, 4, 99], jnp.int32), jnp.asarray([0, 5, 2, 50], jnp.int32))
    want = ejk.flash_attention_varlen(q, k, k, [0, 6, 6, 12], [0, 5, 5, 10], platform="xla")
    assert_close(got, want, jnp.float32)
    shifted = run(jnp.asarray([3, 8, 8, 8], jnp.int32), jnp.asarray([0, 4, 4, 4], jnp.int32))
    assert not np.any(np.asarray(shifted[:3])) and not np.any(np.asarray(shifted[8:]))  # rows of no sequence
    want = ejk.flash_attention_varlen(q[3:8], k[:4], k[:4], [0, 5], [0, 4], platform="xla")
    assert_close(shifted[3:8], want, jnp.float32)


def test_padding_rows_get_zero_output_and_zero_gradients() -> None:
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.standard_normal((10, 2, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((9, 2, 8)), jnp.float32)
    cu_q, cu_k = jnp.asarray([0, 3, 7], jnp.int32), jnp.asarray([0, 4, 6], jnp.int32)

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(ejk.flash_attention_varlen(q, k, v, cu_q, cu_k, platform="xla", cfg=SMALL) ** 2)

    out = ejk.flash_attention_varlen(q, k, k, cu_q, cu_k, platform="xla", cfg=SMALL)
    dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, k)
    assert not np.any(np.asarray(out[7:])) and not np.any(np.asarray(dq[7:]))
    assert not np.any(np.asarray(dk[6:])) and not np.any(np.asarray(dv[6:]))
    assert np.all(np.isfinite(np.asarray(dq))) and np.any(np.asarray(dk[:6]))


def test_precision_default_and_choice() -> None:
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((16, 2, 8)), jnp.float32)
    cu = jnp.asarray([0, 9, 16], jnp.int32)
    want = reference_flash_attention_varlen(q, q, q, cu, cu, causal=True)
    for precision in ("highest", "default", None):
        got = ejk.flash_attention_varlen(q, q, q, cu, cu, causal=True, precision=precision, platform="xla")
        assert_close(got, want, jnp.float32)


def test_vmap_over_packings() -> None:
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.standard_normal((3, 12, 2, 8)), jnp.float32)
    cu = jnp.asarray([[0, 5, 12], [0, 2, 9], [0, 12, 12]], jnp.int32)
    got = jax.vmap(lambda q, cu: ejk.flash_attention_varlen(q, q, q, cu, cu, causal=True, platform="xla",
                                                            cfg=SMALL))(q, cu)
    for i in range(3):
        assert_close(got[i], reference_flash_attention_varlen(q[i], q[i], q[i], cu[i], cu[i], causal=True),
                     jnp.float32)
