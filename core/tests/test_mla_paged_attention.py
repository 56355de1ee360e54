"""``mla_paged_attention`` without plugins: validation, the float64 reference, shard rule and bench cases."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejk.ops import get_op
from ejk.ops._mla_paged_attention._bench import BENCH, MlaCase, MlaWorkload
from ejk.ops._mla_paged_attention._check import check_mla_paged_attention_args
from ejk.testing import mla_batch, mla_paged_attention_float64, reference_flash_attention

I32 = jnp.int32


def _sds(*shape: int, dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def check(q: Any = None, kv: Any = None, lens: Any = None, table: Any = None, *, v_head_dim: Any = 64,
          softmax_scale: Any = None, causal: Any = True) -> tuple[int, float, bool]:
    """The checks on 2 sequences of up to 3 pages of 4 positions, Dk 80."""
    return check_mla_paged_attention_args(
        _sds(2, 1, 8, 80) if q is None else q, _sds(6, 4, 80) if kv is None else kv,
        _sds(2, dtype=I32) if lens is None else lens, _sds(2, 3, dtype=I32) if table is None else table,
        v_head_dim=v_head_dim, softmax_scale=softmax_scale, causal=causal)


def test_resolves_the_static_arguments() -> None:
    assert check() == (64, 1 / math.sqrt(80), True)
    assert check(v_head_dim=80, softmax_scale=0.5, causal=False) == (80, 0.5, False)
    assert check(v_head_dim=np.int64(3))[0] == 3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"q": _sds(2, 8, 80)}, r"q has shape \(2, 8, 80\) but needs \[B, Sq, Hq, Dk\]"),
    ({"kv": _sds(6, 4, 1, 80)}, r"kv_pages has shape \(6, 4, 1, 80\) but needs \[P, page, Dk=80\]"),
    ({"kv": _sds(6, 4, 64)}, r"kv_pages has shape \(6, 4, 64\) but needs \[P, page, Dk=80\]"),
    ({"kv": _sds(0, 4, 80)}, r"kv_pages has shape \(0, 4, 80\) .* with P and page at least 1"),
    ({"lens": _sds(3, dtype=I32)}, r"kv_lens has shape \(3,\) but needs \[B=2\]"),
    ({"table": _sds(3, 3, dtype=I32)}, r"page_indices has shape \(3, 3\) but needs \[B=2, pages_per_seq\]"),
    ({"table": _sds(2, 3)}, r"page_indices has dtype bfloat16 but needs an integer dtype"),
    ({"q": _sds(2, 1, 8, 80, dtype=jnp.float64)}, r"q has dtype float64 but needs"),
    ({"kv": _sds(6, 4, 80, dtype=I32)}, r"kv_pages has dtype int32"),
    ({"v_head_dim": 81}, r"v_head_dim is 81 but needs an int in \[1, Dk=80\]"),
    ({"v_head_dim": 0}, r"v_head_dim is 0"),
    ({"v_head_dim": True}, r"v_head_dim is True"),
    ({"v_head_dim": 64.0}, r"v_head_dim is 64.0"),
    ({"softmax_scale": -1.0}, r"softmax_scale is -1.0 but needs a finite number > 0"),
    ({"causal": 1}, r"causal is 1 but needs a bool"),
])
def test_bad_arguments_name_the_argument_and_the_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"mla_paged_attention: {message}"):
        check(**kwargs)


def test_concrete_lengths_and_pages_are_checked() -> None:
    table = jnp.asarray([[0, 1, 2], [5, -1, 99]], I32)  # sequence 1 uses one page: the rest is never read
    check(lens=jnp.asarray([12, 3], I32), table=table)
    with pytest.raises(ValueError, match=r"kv_lens has negative entries \[1\]=-1 but needs lengths >= 0"):
        check(lens=jnp.asarray([3, -1], I32), table=table)
    with pytest.raises(ValueError, match=r"kv_lens <= pages_per_seq \* page = 3 \* 4 = 12"):
        check(lens=jnp.asarray([13, 1], I32), table=table)
    with pytest.raises(ValueError, match=r"page_indices\[1, 1\] is -1 but needs a page index in \[0, P=6\)"):
        check(lens=jnp.asarray([12, 5], I32), table=table)
    with pytest.raises(ValueError, match=r"page_indices\[1, 0\] is 7"):
        check(lens=jnp.asarray([0, 1], I32), table=jnp.asarray([[0, 1, 2], [7, 0, 0]], I32))


def test_public_function_validates_before_dispatch() -> None:
    import ejk

    q, kv, lens, table = mla_batch(0, kv_lens=(3, 2))
    with pytest.raises(ValueError, match="mla_paged_attention: v_head_dim is 100"):
        ejk.mla_paged_attention(q, kv, lens, table, v_head_dim=100)
    with pytest.raises(ValueError, match="mla_paged_attention: kv_lens has dtype float64"):
        ejk.mla_paged_attention(q, kv, np.asarray([3.0, 2.0]), table, v_head_dim=64)


@pytest.mark.parametrize(("sq", "causal"), [(3, True), (3, False)])
def test_reference_is_flash_attention_over_the_gathered_latents(sq: int, causal: bool) -> None:
    """Per sequence, the same as flash attention with keys = the latents (one kv head) and values
    = their first Dv dims; rows that see nothing (kv_len < Sq) are zeros in both."""
    q, kv, lens, table = mla_batch(1, kv_lens=(9, 2), sq=sq, hq=4, dk=24, page=4, dtype=jnp.float32)
    got = mla_paged_attention_float64(q, kv, lens, table, v_head_dim=16, softmax_scale=0.3, causal=causal)
    for b, n in enumerate(np.asarray(lens)):
        latent = np.asarray(kv)[np.asarray(table)[b, : -(-n // 4)]].reshape(-1, 24)[:n]
        k = jnp.asarray(latent)[None, :, None, :]
        want = reference_flash_attention(q[b:b + 1], k, k[..., :16], causal=causal, softmax_scale=0.3)
        np.testing.assert_allclose(got[b], np.asarray(want[0]), atol=2e-5, rtol=2e-5)


def test_reference_edges() -> None:
    q, kv, lens, table = mla_batch(2, kv_lens=(0, 1, 2), sq=3, hq=2, dk=8, page=2)
    out = mla_paged_attention_float64(q, kv, lens, table, v_head_dim=8)
    assert out.dtype == np.float64 and out.shape == (3, 3, 2, 8)
    assert not out[0].any() and not out[1, :2].any() and not out[2, 0].any()
    # one visible key: its value exactly
    first = np.asarray(kv, np.float64)[int(table[1, 0]), 0]
    np.testing.assert_allclose(out[1, 2], np.broadcast_to(first, (2, 8)))
    reference = get_op("mla_paged_attention").reference_fn()
    assert reference is not None
    assert reference(q.astype(jnp.bfloat16), kv, lens, table, v_head_dim=4).dtype == jnp.bfloat16


def test_output_is_declared_without_tracing_the_reference() -> None:
    output = get_op("mla_paged_attention").output_fn()
    assert output is not None
    got = output(_sds(2, 3, 8, 80), _sds(6, 4, 80), _sds(2, dtype=I32), _sds(2, 3, dtype=I32), v_head_dim=64,
                 softmax_scale=0.1, causal=True)
    assert got == jax.ShapeDtypeStruct((2, 3, 8, 64), jnp.bfloat16)


def _plan(layout: dict[int, tuple[tuple[str, ...], ...]]) -> Any:
    arrays = (_sds(8, 2, 16, 80), _sds(40, 4, 80), _sds(8, dtype=I32), _sds(8, 5, dtype=I32))
    mesh = {"x": 2, "y": 4}

    def axes_of(x: Any, dim: int) -> tuple[str, ...]:
        for i, spec in layout.items():
            if arrays[i] is x and dim < len(spec):
                return spec[dim]
        return ()

    return get_op("mla_paged_attention").shard_rule_fn()(arrays, axes_of, lambda a: math.prod(mesh[n] for n in a))


def test_shard_rule_splits_sequences_and_heads_never_pages() -> None:
    plan = _plan({0: (("x",), (), ("y",))})
    assert plan.in_specs == (P("x", None, "y", None), P(None, None, None), P("x"), P("x", None))
    assert plan.out_specs == P("x", None, "y", None) and plan.body is None
    heads = _plan({0: ((), (), ("x",)), 1: (("y",),)})  # a split page pool is gathered
    assert heads.in_specs[:2] == (P(None, None, "x", None), P(None, None, None))
    shared = _plan({0: (("y",), (), ("y",))})  # one axis on both: the batch keeps it
    assert shared.out_specs == P("y", None, None, None)


def test_bench_presets_and_work() -> None:
    shapes = {(c.batch, c.ctx, c.sq, c.hq) for c in BENCH.presets}
    assert shapes == {(b, c, s, h) for b in (64, 128) for c in (4096, 8192) for s in (1, 2) for h in (16, 64, 128)}
    assert all((c.dk, c.dv, c.page) == (576, 512, 64) for c in BENCH.presets)
    decode = MlaWorkload(case=MlaCase(batch=64, ctx=4096, hq=16), dtype=jnp.bfloat16)
    assert decode.work("fwd") == (64 * 4096 * 576 * 2, "GB/s")
    mtp = MlaWorkload(case=MlaCase(batch=2, ctx=10, sq=2, hq=128), dtype=jnp.bfloat16)
    assert mtp.work("fwd") == (2 * 2 * 128 * (576 + 512) * (9 + 10), "TFLOP/s")
    q, kv, lens, table = MlaWorkload(case=MlaCase(batch=2, ctx=100, sq=2, hq=4, dk=24, dv=16, page=16),
                                     dtype=jnp.float32).inputs()
    assert (q.shape, kv.shape, table.shape) == ((2, 2, 4, 24), (14, 16, 24), (2, 7))
    assert sorted(np.asarray(table).ravel().tolist()) == list(range(14)) and lens.tolist() == [100, 100]
    assert BENCH.parse("64x4096", {"sq": "2", "hq": "128"}, "mla:64x4096:sq=2,hq=128") == MlaCase(
        batch=64, ctx=4096, sq=2, hq=128)
    with pytest.raises(ValueError, match="dv=600 needs to be at most dk=576"):
        BENCH.parse("1x64", {"dv": "600"}, "mla:1x64:dv=600")
