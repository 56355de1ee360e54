"""ragged_paged_attention, matmul and grouped_matmul (Triton-lowered; Mosaic TPU) against the references.

On a CPU the kernels run in interpret mode (GPU kernels ``interpret=True``, TPU kernels under the
TPU interpreter): small shapes. Tests marked ``gpu`` run real sizes compiled on an NVIDIA GPU.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.plugin import devices
from ejk.testing import (
    MATMUL_SHAPES,
    assert_close,
    check_grouped_matmul,
    check_matmul,
    check_ragged_paged_attention,
    paged_batch,
    reference_grouped_matmul,
    reference_matmul,
    reference_ragged_paged_attention,
    values_and_grads,
)
from ejk_pallas import _env, _grouped_matmul, _matmul, _matmul_tpu, _paged_attention, _paged_attention_tpu
from ejk_pallas._group_metadata import work_list
from ejk_pallas._matmul_tpu import TpuMatmulConfig

ON_GPU = _env.nvidia_gpu()[0]
ON_TPU = jax.default_backend() == "tpu"
BACKEND = "gpu" if ON_GPU else "tpu" if ON_TPU else "cpu"
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_PALLAS_INTERPRET=1")
needs_tpu_kernels = pytest.mark.skipif(not (ON_TPU or _env.use_interpreter()),
                                       reason="needs a TPU or EJK_PALLAS_INTERPRET=1 on a CPU")


def choice(implementation: str, cfg: Any = None) -> ejk.ImplChoice:
    backend = "cpu" if _env.use_interpreter() else BACKEND
    return ejk.ImplChoice(platform="pallas", backend=backend, implementation=implementation, cfg=cfg)


# ----------------------------------------------------------------------------------------------
# ragged_paged_attention
# ----------------------------------------------------------------------------------------------

# (kv_lens, q_lens, num_seqs, hq, hkv, page, options): decode, chunked prefill, GQA 1 / 2 / 8, contexts over
# several pages ending in partial pages, a length-1 context, padding sequences, windows, soft cap.
PAGED_CASES = [
    ([37, 5, 16, 1], [1, 1, 1, 1], 4, 8, 1, 16, {}),  # decode, GQA 8, partial pages, length 1
    ([50, 20], [1, 1], 2, 4, 4, 16, {"sliding_window": 9}),  # decode, GQA 1, window
    ([33, 18, 9], [7, 18, 2], 2, 4, 2, 16, {"logits_soft_cap": 5.0}),  # prefill chunks, a padding sequence
    ([70], [19], 1, 2, 1, 32, {"sliding_window": (12, 0)}),  # one long chunk across pages, window
]


def paged_case(kv_lens: list[int], q_lens: list[int], num_seqs: int, hq: int, hkv: int, page: int,
               dtype: Any, seed: int = 0) -> list[Any]:
    return paged_batch(seed, q_lens=q_lens, kv_lens=kv_lens, num_seqs=num_seqs, page=page, hq=hq, hkv=hkv, d=16,
                       spare_pages=3, dtype=dtype)


@needs_kernels
@pytest.mark.parametrize(("case", "dtype"), [*((c, jnp.float32) for c in PAGED_CASES),
                                             (PAGED_CASES[0], jnp.bfloat16), (PAGED_CASES[2], jnp.bfloat16)],
                         ids=lambda x: f"kv{x[0]}-q{x[1]}-h{x[3]}x{x[4]}" if isinstance(x, list | tuple) else None)
def test_paged_matches_reference(case: tuple[Any, ...], dtype: Any) -> None:
    kv_lens, q_lens, num_seqs, hq, hkv, page, options = case
    args = paged_case(kv_lens, q_lens, num_seqs, hq, hkv, page, dtype)
    want = reference_ragged_paged_attention(*args, **options)
    # one page a step (a 2-D load) and two query programs; two pages a step (a gather) and split-K
    for splits, pages_per_step, q_programs in ((1, 1, 2), (3, 2, 1)):
        cfg = _paged_attention.PagedAttentionConfig(block_q=2, block_kv=page * pages_per_step, num_splits=splits,
                                                    q_programs=q_programs)
        got = ejk.ragged_paged_attention(*args, platform="pallas", cfg=choice("triton_lowered", cfg), **options)
        assert got.dtype == args[0].dtype
        assert_close(got, want, dtype, what=f"paged {case} splits={splits}")


@needs_kernels
def test_paged_nan_outside_the_context_does_not_leak() -> None:
    args = paged_case([21, 7], [1, 1], 2, 4, 2, 16, jnp.float32)
    k_pages, v_pages, table = args[1], args[2], np.asarray(args[4])
    poison = (table[0, 1], slice(5, None))  # seq 0: keys 21.. of its second page (it sees 0..20)
    args[1] = k_pages.at[poison].set(jnp.nan)
    args[2] = v_pages.at[poison].set(jnp.nan)
    got = ejk.ragged_paged_attention(*args, platform="pallas", cfg=choice("triton_lowered"))
    assert np.isfinite(np.asarray(got)).all()
    assert_close(got, reference_ragged_paged_attention(*args), jnp.float32, what="paged, NaN outside the context")


@needs_kernels
def test_paged_conformance() -> None:
    assert check_ragged_paged_attention("pallas", dtypes=(jnp.float32,), cfg=choice("triton_lowered")) == 3


def test_paged_gate_and_configs() -> None:
    sds = jax.ShapeDtypeStruct
    q, kp = sds((4, 8, 128), jnp.bfloat16), sds((32, 16, 2, 128), jnp.bfloat16)
    table, lens, cu = sds((4, 8), jnp.int32), sds((4,), jnp.int32), sds((5,), jnp.int32)
    args = (q, kp, kp, lens, table, cu, sds((), jnp.int32))
    assert "float64" in (_paged_attention.capability(sds((4, 8, 128), jnp.float64), kp, kp, *args[3:]) or "")
    assert "page size 12" in (_paged_attention.capability(q, sds((32, 12, 2, 128), jnp.bfloat16),
                                                          sds((32, 12, 2, 128), jnp.bfloat16), *args[3:]) or "")
    assert "head_dim 80" in (_paged_attention.capability(sds((4, 8, 80), jnp.bfloat16), sds((32, 16, 2, 80),
                                                         jnp.bfloat16), kp, *args[3:]) or "")
    space = _paged_attention.config_space(*args)
    assert space[0] == _paged_attention.heuristic_config(*args) and len(set(space)) == len(space)


# ----------------------------------------------------------------------------------------------
# matmul
# ----------------------------------------------------------------------------------------------

SMALL_SHAPES = MATMUL_SHAPES[:6]


@needs_kernels
def test_matmul_conformance() -> None:
    check_matmul("pallas", dtypes=(jnp.float32,), cfg=choice("triton_lowered"), shapes=SMALL_SHAPES)


@needs_kernels
@pytest.mark.parametrize(("sa", "sb", "dtype", "out"), [
    ((40, 24), (24, 33), jnp.bfloat16, None),  # ragged edges, several tiles each way
    ((2, 1, 9, 20), (3, 20, 17), jnp.float16, jnp.float32),  # broadcast batches on both sides
    ((20,), (3, 20, 5), jnp.float32, jnp.bfloat16),  # 1-D a, batched b
])
def test_matmul_matches_reference(sa: tuple[int, ...], sb: tuple[int, ...], dtype: Any, out: Any) -> None:
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal(s), dtype) for s in (sa, sb))
    got, grads = values_and_grads(lambda a, b: ejk.matmul(a, b, preferred_element_type=out, platform="pallas",
                                                           cfg=choice("triton_lowered")), (a, b))
    want, want_grads = values_and_grads(lambda a, b: reference_matmul(a, b, preferred_element_type=out), (a, b))
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got, want, dtype, what="matmul")
    for g, w, name in zip(grads, want_grads, "ab", strict=True):
        assert g.dtype == dtype
        assert_close(g, w, dtype, what=f"matmul d{name}")


@pytest.mark.parametrize("b,ctx,want", [(8, 2048, 6), (16, 2048, 3), (64, 2048, 1), (1, 2048, 8), (1, 128, 1)])
def test_paged_splits_load_the_sms_evenly(b: int, ctx: int, want: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode split-K on 132 SMs (8 kv heads, page 64, 64 keys a step): at least about two programs per SM
    and 4 key steps a split, then the count that loads the SMs most evenly (6 splits, not 5, at batch 8)."""
    monkeypatch.setattr(devices, "sm_count", lambda: 132)
    per = ctx // 64
    k = jax.ShapeDtypeStruct((b * per, 64, 8, 128), jnp.bfloat16)
    table = jax.ShapeDtypeStruct((b, per), jnp.int32)
    q = jax.ShapeDtypeStruct((b, 32, 128), jnp.bfloat16)
    splits = _paged_attention._splits(q, k, table, 64, 1)
    assert splits == want
    assert splits <= max(1, per // 4)  # every split keeps at least 4 key steps


def test_matmul_gate_and_configs() -> None:
    sds = jax.ShapeDtypeStruct
    a, b = sds((4096, 4096), jnp.bfloat16), sds((4096, 4096), jnp.bfloat16)
    assert "int32" in (_matmul.capability(sds((4, 4), jnp.int32), b) or "")
    assert "preferred_element_type int32" in (_matmul.capability(a, b, preferred_element_type=jnp.int32) or "")
    space = _matmul.config_space(a, b)
    assert space[0] == _matmul.heuristic_config(a, b)
    if not _env.use_interpreter():
        assert all(_matmul.smem_bytes(c, 2) <= 227 * 1024 for c in space)


# ----------------------------------------------------------------------------------------------
# grouped_matmul
# ----------------------------------------------------------------------------------------------


def test_work_list_covers_every_row_once() -> None:
    sizes = jnp.asarray([0, 5, 0, 20, 3, 0], jnp.int32)
    m, bm = 40, 8
    work = work_list(sizes, m, bm, zero_group=True, visit_empty=False)
    count = int(work.items[0])
    group, tile, offs = (np.asarray(x) for x in (work.group, work.tile, work.offsets))
    covered = np.zeros(m, int)
    for w in range(count):
        rows = np.arange(tile[w] * bm, tile[w] * bm + bm)
        covered[rows[(rows >= offs[group[w]]) & (rows < offs[group[w] + 1])]] += 1
    assert (covered == 1).all() and 0 not in group[:count] and 2 not in group[:count]  # empty groups: no item
    assert (group[count:] == group[count - 1]).all() and (tile[count:] == tile[count - 1]).all()
    empty = work_list(sizes, m, bm, zero_group=False, visit_empty=True)
    assert set(np.asarray(empty.group)[: int(empty.items[0])]) == set(range(6))


@needs_kernels
def test_grouped_conformance() -> None:
    check_grouped_matmul("pallas", dtypes=(jnp.float32,), cfg=choice("triton_lowered"))


@needs_kernels
@pytest.mark.parametrize(("sizes", "dtype"), [([0, 13, 0, 30, 1], jnp.bfloat16), ([50], jnp.float16)])
def test_grouped_matches_reference(sizes: list[int], dtype: Any) -> None:
    rng = np.random.default_rng(0)
    m, k, n = 50, 24, 40
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n)), dtype)
    gs = jnp.asarray(sizes, jnp.int32)
    got, grads = values_and_grads(lambda x, w: ejk.grouped_matmul(x, w, gs, platform="pallas",
                                                                                 cfg=choice("triton_lowered")),
                                   (lhs, rhs))
    want, want_grads = values_and_grads(lambda x, w: reference_grouped_matmul(x, w, gs), (lhs, rhs))
    assert_close(got, want, dtype, what="grouped")
    for g, w, name in zip(grads, want_grads, ("lhs", "rhs"), strict=True):
        assert_close(g, w, dtype, what=f"grouped d{name}")


@needs_kernels
def test_grouped_under_vmap() -> None:
    """Each mapped problem has its own group sizes (the work list is computed per problem)."""
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((2, 20, 9)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((2, 3, 9, 7)), jnp.float32)
    gs = jnp.asarray([[5, 0, 11], [20, 0, 0]], jnp.int32)
    got = jax.vmap(lambda x, w, s: ejk.grouped_matmul(x, w, s, platform="pallas", cfg=choice("triton_lowered")))(
        lhs, rhs, gs)
    assert_close(got, jax.vmap(reference_grouped_matmul)(lhs, rhs, gs), jnp.float32, what="grouped under vmap")


def test_grouped_gate_and_configs() -> None:
    sds = jax.ShapeDtypeStruct
    lhs, rhs, gs = sds((4096, 2048), jnp.bfloat16), sds((64, 2048, 1536), jnp.bfloat16), sds((64,), jnp.int32)
    assert "group_sizes of dtype float32" in (_grouped_matmul.capability(lhs, rhs, sds((64,), jnp.float32)) or "")
    assert "grid limit" in (_grouped_matmul.capability(sds((2**21, 8), jnp.bfloat16), sds((4, 8, 8), jnp.bfloat16),
                                                       sds((4,), jnp.int32)) or "")
    space = _grouped_matmul.config_space(lhs, rhs, gs)
    assert space[0] == _grouped_matmul.heuristic_config(lhs, rhs, gs)


# ----------------------------------------------------------------------------------------------
# GPU (marker `gpu`): compiled at real sizes
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("hq", "hkv", "page", "dtype"), [(32, 8, 16, jnp.bfloat16), (8, 8, 64, jnp.float16),
                                                           (16, 2, 32, jnp.bfloat16)])
def test_gpu_paged(hq: int, hkv: int, page: int, dtype: Any) -> None:
    kv_lens = [2000, 1, 517, 4096]
    for q_lens in ([1, 1, 1, 1], [100, 1, 37, 256]):
        args = paged_batch(0, q_lens=q_lens, kv_lens=kv_lens, page=page, hq=hq, hkv=hkv, d=128, dtype=dtype)
        for options in ({}, {"sliding_window": 300, "logits_soft_cap": 30.0}):
            got = ejk.ragged_paged_attention(*args, platform="pallas", cfg=choice("triton_lowered"), **options)
            assert_close(got, reference_ragged_paged_attention(*args, **options), dtype, what=f"{q_lens} {options}")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_conformance() -> None:
    check_matmul("pallas", cfg=choice("triton_lowered"))
    check_grouped_matmul("pallas", cfg=choice("triton_lowered"))
    check_ragged_paged_attention("pallas", cfg=choice("triton_lowered"))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_every_config_runs() -> None:
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((1000, 768)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((768, 1100)), jnp.bfloat16)
    for cfg in _matmul.config_space(a, b)[:6]:
        got = ejk.matmul(a, b, platform="pallas", cfg=choice("triton_lowered", cfg))
        assert_close(got, reference_matmul(a, b), jnp.bfloat16, what=str(cfg))
    rhs = jnp.asarray(rng.standard_normal((8, 768, 1100)), jnp.bfloat16)
    gs = jnp.asarray([0, 300, 1, 0, 450, 100, 0, 49], jnp.int32)
    for gcfg in _grouped_matmul.config_space(a, rhs, gs)[:4]:
        got, grads = values_and_grads(lambda x, w, c=gcfg: ejk.grouped_matmul(x, w, gs, platform="pallas", cfg=choice(
            "triton_lowered", c)), (a, rhs))
        want, want_grads = values_and_grads(lambda x, w: reference_grouped_matmul(x, w, gs), (a, rhs))
        assert_close(got, want, jnp.bfloat16, what=str(gcfg))
        for g, w in zip(grads, want_grads, strict=True):
            assert_close(g, w, jnp.bfloat16, what=f"grad {gcfg}")


# ----------------------------------------------------------------------------------------------
# Mosaic TPU (untested on TPU hardware): the TPU interpret mode on the CPU (slow: tiny shapes)
# ----------------------------------------------------------------------------------------------


@needs_tpu_kernels
def test_mosaic_tpu_matmul() -> None:
    cfg = choice("mosaic_tpu", TpuMatmulConfig(block_m=8, block_n=128, block_k=128))
    shapes = (((2, 1, 12, 9), (3, 9, 7)), ((9,), (9, 5)))
    check_matmul("pallas", dtypes=(jnp.float32,), cfg=cfg, shapes=shapes)


@needs_tpu_kernels
def test_mosaic_tpu_grouped_matmul() -> None:
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((20, 12)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((4, 12, 6)), jnp.float32)
    gs = jnp.asarray([5, 0, 11, 0], jnp.int32)  # a tile straddling groups, empty groups, trailing rows
    cfg = choice("mosaic_tpu", TpuMatmulConfig(block_m=8, block_n=128, block_k=128))
    got, grads = values_and_grads(lambda x, w: ejk.grouped_matmul(x, w, gs, platform="pallas", cfg=cfg), (lhs, rhs))
    want, want_grads = values_and_grads(lambda x, w: reference_grouped_matmul(x, w, gs), (lhs, rhs))
    assert_close(got, want, jnp.float32, what="grouped (TPU)")
    for g, w, name in zip(grads, want_grads, ("lhs", "rhs"), strict=True):
        assert_close(g, w, jnp.float32, what=f"grouped (TPU) d{name}")


@needs_tpu_kernels
@pytest.mark.parametrize("case", [PAGED_CASES[0], PAGED_CASES[2]], ids=lambda c: f"kv{c[0]}-q{c[1]}")
def test_mosaic_tpu_paged(case: tuple[Any, ...]) -> None:
    kv_lens, q_lens, num_seqs, hq, hkv, _, options = case
    args = paged_case(kv_lens, q_lens, num_seqs, hq, hkv, 8, jnp.float32)
    cfg = choice("mosaic_tpu", _paged_attention_tpu.TpuPagedAttentionConfig(block_rows=8))
    got = ejk.ragged_paged_attention(*args, platform="pallas", cfg=cfg, **options)
    assert_close(got, reference_ragged_paged_attention(*args, **options), jnp.float32, what=f"paged (TPU) {case}")


def test_mosaic_tpu_gates_and_configs() -> None:
    sds = jax.ShapeDtypeStruct
    a = sds((4096, 4096), jnp.bfloat16)
    if not _env.use_interpreter() and not ON_TPU:
        assert "needs a TPU" in (_matmul_tpu.matmul_capability(a, a) or "")
    assert "int8" in (_matmul_tpu.matmul_capability(sds((4, 4), jnp.int8), a) or "")
    space = _matmul_tpu.matmul_config_space(a, a)
    assert space[0] == _matmul_tpu.heuristic_config(a, a)
    if not _env.use_interpreter():
        assert all(_matmul_tpu.vmem_bytes(c, 2) <= 16 * 2**20 for c in space)


# ----------------------------------------------------------------------------------------------
# Lowering without the hardware: Pallas's Triton lowering for CUDA, Mosaic for TPU
# ----------------------------------------------------------------------------------------------


def _lowered(fn: Any, *args: Any, platform: str) -> str:
    return str(jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text())


@pytest.mark.skipif(ON_TPU, reason="lowers for CUDA")
def test_lowers_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and backward kernels pass Pallas's Triton lowering (gathers, masked stores, dot algorithms)."""
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    sds = jax.ShapeDtypeStruct
    mm_cfg = _matmul.MatmulConfig()
    for dtype in (jnp.bfloat16, jnp.float32):
        a, b, c = sds((256, 512), dtype), sds((512, 384), dtype), sds((256, 384), dtype)
        text = _lowered(lambda a, b, c: (_matmul.forward(a, b, cfg=mm_cfg, precision=("high", "high")),
                                         _matmul.vjp.bwd((a, b), c, cfg=mm_cfg)), a, b, c, platform="cuda")
        assert text.count("__gpu$xla.gpu.triton") == 3
    g_cfg = _grouped_matmul.GroupedMatmulConfig()
    lhs, rhs, out = sds((512, 256), jnp.bfloat16), sds((8, 256, 384), jnp.bfloat16), sds((512, 384), jnp.bfloat16)
    text = _lowered(lambda x, w, g, d: (_grouped_matmul.forward(x, w, g, cfg=g_cfg),
                                        _grouped_matmul.vjp.bwd((x, w, g), d, cfg=g_cfg)),
                    lhs, rhs, sds((8,), jnp.int32), out, platform="cuda")
    assert text.count("__gpu$xla.gpu.triton") == 3
    pages = sds((64, 16, 8, 128), jnp.bfloat16)
    for splits, block_kv in ((1, 16), (4, 64)):
        p_cfg = _paged_attention.PagedAttentionConfig(block_kv=block_kv, num_splits=splits)
        text = _lowered(lambda *a, c=p_cfg: _paged_attention.ragged_paged_attention(
            *a, softmax_scale=0.1, sliding_window=(100, 0), logits_soft_cap=None, cfg=c),
            sds((8, 32, 128), jnp.bfloat16), pages, pages, sds((8,), jnp.int32), sds((8, 8), jnp.int32),
            sds((9,), jnp.int32), sds((), jnp.int32), platform="cuda")
        assert text.count("__gpu$xla.gpu.triton") == 1


def test_mosaic_tpu_lowers_for_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TPU kernels pass Pallas's Mosaic lowering (a TPU v5p faked through jax's private ``tpu_info``)."""
    try:
        from jax._src.pallas.mosaic import tpu_info
    except ImportError:  # pragma: no cover - jax moved it
        pytest.skip("jax._src.pallas.mosaic.tpu_info not found")
    if not ON_TPU:
        monkeypatch.setattr(tpu_info, "get_device_kind", lambda: "TPU v5p")
        monkeypatch.setattr(tpu_info, "get_num_device_cores", lambda: 1)
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    sds = jax.ShapeDtypeStruct
    cfg = _matmul_tpu.TpuMatmulConfig()
    lhs, rhs, out = sds((512, 256), jnp.bfloat16), sds((8, 256, 384), jnp.bfloat16), sds((512, 384), jnp.bfloat16)
    text = _lowered(lambda x, w, g, d: (_matmul_tpu.grouped_forward(x, w, g, cfg=cfg),
                                        _matmul_tpu.grouped_vjp.bwd((x, w, g), d, cfg=cfg),
                                        _matmul_tpu.matmul_vjp.bwd((x, w[0]), d, cfg=cfg)),
                    lhs, rhs, sds((8,), jnp.int32), out, platform="tpu")
    assert text.count("tpu_custom_call") == 5
    pages = sds((64, 16, 8, 128), jnp.bfloat16)
    text = _lowered(lambda *a: _paged_attention_tpu.ragged_paged_attention(
        *a, softmax_scale=0.1, sliding_window=(100, 0), logits_soft_cap=20.0, cfg=None),
        sds((8, 32, 128), jnp.bfloat16), pages, pages, sds((8,), jnp.int32), sds((8, 8), jnp.int32),
        sds((9,), jnp.int32), sds((), jnp.int32), platform="tpu")
    assert text.count("tpu_custom_call") == 1


@pytest.mark.skipif(ON_TPU, reason="lowers for CUDA")
def test_lowers_for_cuda_under_shard_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside ``jax.shard_map`` (``check_vma``) the kernels' outputs vary along the inputs' mesh axes."""
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("x",))

    def arg(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    def ops(a: Any, b: Any, rhs: Any, gs: Any, q: Any, pages: Any, lens: Any, table: Any, cu: Any) -> Any:
        out, res = _matmul.vjp.fwd(a, b)
        grouped, g_res = _grouped_matmul.vjp.fwd(a, rhs, gs)
        paged = _paged_attention.ragged_paged_attention(q, pages, pages, lens, table, cu, lens[0], softmax_scale=0.1,
                                                         sliding_window=None, logits_soft_cap=None)
        return _matmul.vjp.bwd(res, out), _grouped_matmul.vjp.bwd(g_res, grouped)[:2], paged

    args = (arg((64, 32), jnp.bfloat16), arg((32, 16), jnp.bfloat16),
            arg((4, 32, 16), jnp.bfloat16), arg((4,), jnp.int32), arg((4, 8, 64), jnp.bfloat16),
            arg((16, 16, 2, 64), jnp.bfloat16), arg((4,), jnp.int32), arg((4, 4), jnp.int32), arg((5,), jnp.int32))
    fn = jax.shard_map(ops, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=True)
    assert _lowered(fn, *args, platform="cuda").count("__gpu$xla.gpu.triton") == 7
