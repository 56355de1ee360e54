"""``flash_attention_varlen`` in the core: validation, the row intervals, the references, the bench workload."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk.ops import sanitize_offsets, varlen_row_ranges
from ejk.ops._flash_attention_varlen import _ranges
from ejk.ops._flash_attention_varlen._bench import BENCH, RAGGED_32K, VarlenCase, VarlenWorkload
from ejk.ops._flash_attention_varlen._op import flash_attention_varlen_call
from ejk.ops._flash_attention_varlen._reference import (
    reference_flash_attention_varlen,
    reference_varlen_per_sequence,
    varlen_mask,
)
from ejk.ops._flash_attention_varlen._samples import samples
from ejk.testing import assert_close

sds = jax.ShapeDtypeStruct
Q, K = sds((20, 4, 16), jnp.bfloat16), sds((18, 2, 16), jnp.bfloat16)
CU = np.asarray([0, 5, 12], np.int32)


def _call(**overrides: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args: dict[str, Any] = dict(q=Q, k=K, v=K, cu_seqlens_q=CU, cu_seqlens_k=CU)
    kwargs = {name: overrides.pop(name) for name in list(overrides) if name not in args}
    args.update(overrides)
    return flash_attention_varlen_call(*args.values(), **kwargs)


def test_static_arguments_are_normalised() -> None:
    _, static = _call(causal=True, sliding_window=(100, 9))
    assert static == {"causal": True, "softmax_scale": 0.25, "sliding_window": (17, 0), "logits_soft_cap": None,
                      "max_seqlen_q": None, "max_seqlen_k": None, "precision": "default"}  # bf16: precision moot
    q32 = sds((20, 4, 16), jnp.float32)
    k32 = sds((18, 2, 16), jnp.float32)
    assert _call(q=q32, k=k32, v=k32)[1]["precision"] == "highest"
    assert _call(q=q32, k=k32, v=k32, precision=jax.lax.Precision.DEFAULT)[1]["precision"] == "default"
    assert _call(q=q32, k=k32, v=k32, precision="fastest")[1]["precision"] == "default"
    assert _call(max_seqlen_q=7, max_seqlen_k=8)[1]["max_seqlen_q"] == 7


@pytest.mark.parametrize(("overrides", "message"), [
    ({"q": sds((20, 16), jnp.bfloat16)}, r"q has shape \(20, 16\) but needs \[Tq, Hq, D\]"),
    ({"k": sds((18, 3, 16), jnp.bfloat16), "v": sds((18, 3, 16), jnp.bfloat16)}, "divides the 4 q heads"),
    ({"k": sds((18, 2, 8), jnp.bfloat16)}, r"k has shape .* needs \[Tk, Hkv, D=16\]"),
    ({"v": sds((17, 2, 16), jnp.bfloat16)}, r"v has shape \(17, 2, 16\) but needs \[Tk=18"),
    ({"v": sds((18, 2, 16), jnp.float16)}, "one common dtype"),
    ({"q": sds((20, 4, 16), jnp.int32)}, "q has dtype int32"),
    ({"cu_seqlens_k": np.asarray([0, 5], np.int32)}, r"cu_seqlens_k has shape \(2,\) but needs \(3,\)"),
    ({"cu_seqlens_q": np.zeros((1, 3), np.int32)}, "cu_seqlens_q has shape"),
    ({"cu_seqlens_q": np.asarray([0.0, 5.0, 12.0], np.float32)}, "cu_seqlens_q has dtype float32"),
    ({"cu_seqlens_q": np.asarray([], np.int32), "cu_seqlens_k": np.asarray([], np.int32)}, "N >= 0"),
    ({"cu_seqlens_q": np.asarray([1, 5, 12], np.int32)}, "cu_seqlens_q starts at 1 but needs to start at 0"),
    ({"cu_seqlens_k": np.asarray([0, 9, 4], np.int32)}, r"cu_seqlens_k decreases at \[2\] \(9 then 4\)"),
    ({"cu_seqlens_q": np.asarray([0, 5, 21], np.int32)}, r"cu_seqlens_q ends at 21 but needs an end <= 20"),
    ({"sinks": sds((2,), jnp.float32)}, r"sinks has shape \(2,\) but needs \[Hq=4\]"),
    ({"sinks": sds((4,), jnp.int32)}, "sinks has dtype int32"),
    ({"causal": 1}, "causal is 1 but needs a bool"),
    ({"sliding_window": -1}, "sliding_window is -1"),
    ({"logits_soft_cap": 0.0}, "logits_soft_cap is 0.0"),
    ({"max_seqlen_q": 0}, "max_seqlen_q is 0 but needs None or an int >= 1"),
    ({"max_seqlen_k": 6}, "max_seqlen_k is 6 but the longest sequence of the offsets has 7 tokens"),
    ({"precision": "fast"}, "precision is 'fast'"),
    ({"precision": ("highest", "default")}, "one precision for every product"),
])
def test_bad_arguments_name_the_argument(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"flash_attention_varlen: .*{message}"):
        _call(**overrides)


def test_traced_offsets_are_not_value_checked() -> None:
    def validate(cu: jax.Array) -> jax.Array:
        _call(cu_seqlens_q=cu, cu_seqlens_k=cu)
        return cu

    jax.jit(validate)(jnp.asarray([0, 9, 4], jnp.int32))  # decreasing, but only known at run time: no error


@pytest.mark.parametrize("options", [{}, {"causal": True}, {"sliding_window": (2, 1)},
                                     {"causal": True, "sliding_window": (3, 0)}])
@pytest.mark.parametrize(("cu_q", "cu_k", "tq", "tk"), [
    ([0, 3, 3, 9, 10], [0, 5, 6, 8, 8], 12, 9),  # empty sequences, Sq != Sk both ways, padding rows
    ([0, 4], [0, 4], 4, 4),
    ([0], [0], 3, 2),  # no sequence: every row is padding
    ([2, 6, 4, 40], [0, 1, 9, 3], 10, 7),  # wrong at run time: start above 0, decreasing, past the end
])
@pytest.mark.parametrize("small", [True, False], ids=["compare", "search"])
def test_row_intervals_match_the_mask(cu_q: list[int], cu_k: list[int], tq: int, tk: int,
                                      options: dict[str, Any], small: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # Few offsets take pairwise compares, many a running max and a binary search: both, forced here.
    monkeypatch.setattr(_ranges, "_SMALL", _ranges._SMALL if small else 0)
    cu_q_a, cu_k_a = jnp.asarray(cu_q, jnp.int32), jnp.asarray(cu_k, jnp.int32)
    lo, hi = (np.asarray(x) for x in varlen_row_ranges(cu_q_a, cu_k_a, tq, tk, causal=options.get("causal", False),
                                                        sliding_window=options.get("sliding_window")))
    mask = np.asarray(varlen_mask(cu_q_a, cu_k_a, tq, tk, causal=options.get("causal", False),
                                  sliding_window=options.get("sliding_window")))
    cols = np.arange(tk)
    np.testing.assert_array_equal((cols[None] >= lo[:, None]) & (cols[None] < hi[:, None]), mask)
    assert np.all(np.diff(lo) >= 0) and np.all(np.diff(hi) >= 0) and np.all(lo <= hi)


@pytest.mark.parametrize("small", [True, False], ids=["compare", "cummax"])
def test_sanitize_offsets(small: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ranges, "_SMALL", _ranges._SMALL if small else 0)
    got = sanitize_offsets(jnp.asarray([0, 5, 3, 12, -1], jnp.int32), 10)
    np.testing.assert_array_equal(np.asarray(got), [0, 5, 5, 10, 10])


@pytest.mark.parametrize("case", [
    dict(q_lens=(4, 0, 7), k_lens=(6, 3, 7), pad=2, hq=4, hkv=2, causal=True),
    dict(q_lens=(5, 3), k_lens=(2, 8), pad=0, hq=2, hkv=1, sliding_window=(1, 2), logits_soft_cap=3.0, sinks=True),
    dict(q_lens=(3,), k_lens=(0,), pad=1, hq=2, hkv=2, sinks=True),
])
def test_reference_matches_per_sequence_float64(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    case = dict(case)
    q_lens, k_lens, pad, hq, hkv = (case.pop(n) for n in ("q_lens", "k_lens", "pad", "hq", "hkv"))
    tq, tk = sum(q_lens) + pad, sum(k_lens) + pad
    q, k, v = (rng.standard_normal(s) for s in ((tq, hq, 8), (tk, hkv, 8), (tk, hkv, 8)))
    sinks = rng.standard_normal(hq) if case.pop("sinks", False) else None
    cu_q, cu_k = np.cumsum([0, *q_lens]).astype(np.int32), np.cumsum([0, *k_lens]).astype(np.int32)
    with jax.enable_x64(True):
        per_sequence = jax.jit(lambda q, k, v, sinks: reference_varlen_per_sequence(q, k, v, q_lens, k_lens,
                                                                                    sinks=sinks, **case))
        want = np.asarray(per_sequence(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                       None if sinks is None else jnp.asarray(sinks)))
    f32 = [None if x is None else jnp.asarray(x, jnp.float32) for x in (q, k, v, sinks)]
    packed = jax.jit(lambda q, k, v, sinks: reference_flash_attention_varlen(q, k, v, jnp.asarray(cu_q),
                                                                             jnp.asarray(cu_k), sinks=sinks, **case))
    got = packed(*f32)
    assert_close(got, want, jnp.float32)
    assert not np.any(np.asarray(got)[sum(q_lens):])
    if sinks is not None and k_lens == (0,):
        assert not np.any(np.asarray(got))  # rows that see no key are zeros, sink or not


def test_bench_workload_and_shapes() -> None:
    assert sum(RAGGED_32K) == 32768 and len(RAGGED_32K) == 16 and 1024 <= min(RAGGED_32K) <= max(RAGGED_32K) <= 4096
    case = BENCH.parse("1024+3072x16x128", {"causal": "", "kv": "4"}, "varlen:1024+3072x16x128:causal,kv=4")
    assert case == VarlenCase(lens=(1024, 3072), heads=16, dim=128, kv_heads=4, causal=True)
    assert BENCH.parse("16x2048x16x128", {}, "s").lens == (2048,) * 16
    with pytest.raises(ValueError, match="kv=3 must divide"):
        BENCH.parse("16x2048x16x128", {"kv": "3"}, "s")
    small = VarlenWorkload(case=VarlenCase(lens=(3, 5), heads=2, dim=4, causal=True), dtype="float32")
    q, *_, cu_q, _ = small.inputs()
    assert q.shape == (8, 2, 4) and np.asarray(cu_q).tolist() == [0, 3, 8]
    assert small.work("fwd")[0] == 4.0 * 2 * 4 * (6 + 15) and small.work("fwd+bwd")[0] == 3.5 * small.work("fwd")[0]


def test_samples_validate() -> None:
    for args, kwargs in samples():
        flash_attention_varlen_call(*args, **kwargs)


def test_tuning_inputs_pack_every_token() -> None:
    from ejk.execution.kernel import Invocation
    from ejk.ops._flash_attention_varlen._op import KERNEL

    args = (sds((100, 4, 16), jnp.bfloat16), sds((80, 2, 16), jnp.bfloat16), sds((80, 2, 16), jnp.bfloat16),
            sds((6,), jnp.int32), sds((6,), jnp.int32), None)
    inv = Invocation(op_id=KERNEL.op_id, version=KERNEL.version, args=args, call_key="k", device="cpu")
    *_, cu_q, cu_k, _ = KERNEL.tuning_args(inv)
    for cu, tokens in ((cu_q, 100), (cu_k, 80)):
        host = np.asarray(cu)
        assert host[0] == 0 and host[-1] == tokens and np.all(np.diff(host) >= 0) and host.dtype == np.int32
