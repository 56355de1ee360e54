"""The Mosaic GPU grouped matmul (``pallas/gpu:mosaic`` for ``grouped_matmul``): values, gradients, gate, lowering.

On a CPU the kernel runs in Pallas's Mosaic GPU interpret mode (``EJK_PALLAS_INTERPRET=1``): the persistent
walk of the work list over two CTAs, the warp-specialised TMA ring, the per-group visits of tiles that
straddle groups and their ladders of row stores, the skipped empty groups and list entries, and the zero rows
past the sum are checked, with the MMAs as plain dots. Every config of the space is lowered through the real
Mosaic GPU lowering for CUDA (which checks the WGMMA operands, layouts, transforms and the TMA stores). Tests
marked ``gpu`` run the compiled kernel on a Hopper GPU.
"""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_grouped_matmul, reference_grouped_matmul, values_and_grads
from ejk_pallas import _env
from ejk_pallas import _grouped_matmul_mgpu as mg
from ejk_pallas import _grouped_outer_mgpu as go
from ejk_pallas import _matmul_mgpu as mm
from ejk_pallas._grouped_matmul_mgpu import MosaicGroupedMatmulConfig

ON_GPU = _env.nvidia_gpu()[0]
sds = jax.ShapeDtypeStruct
ON_HOPPER = ON_GPU and mg.capability(sds((8, 8), jnp.bfloat16), sds((1, 8, 8), jnp.bfloat16),
                                     sds((1,), jnp.int32)) is None
needs_kernel = pytest.mark.skipif(
    not (ON_HOPPER or (_env.use_interpreter() and mg._fa.interpret_params() is not None)),
    reason="needs a Hopper GPU, or EJK_PALLAS_INTERPRET=1 and jax's Mosaic GPU interpret mode on a CPU")


def choice(cfg: MosaicGroupedMatmulConfig | None = None) -> ejk.ImplChoice:
    return ejk.ImplChoice(platform="pallas", backend="gpu" if ON_GPU else "cpu", implementation="mosaic", cfg=cfg)


def _inputs(m: int, k: int, n: int, sizes: list[int], dtype: Any, seed: int = 0) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n)) / np.sqrt(k), dtype)
    return lhs, rhs, jnp.asarray(sizes, jnp.int32)


def check(m: int, k: int, n: int, sizes: list[int], dtype: Any, cfg: MosaicGroupedMatmulConfig | None = None,
          out_dtype: Any = None) -> None:
    lhs, rhs, gs = _inputs(m, k, n, sizes, dtype)
    options = {"preferred_element_type": out_dtype}
    got, grads = values_and_grads(
        lambda x, w: ejk.grouped_matmul(x, w, gs, platform="pallas", cfg=choice(cfg), **options), (lhs, rhs), seed=7)
    want, want_grads = values_and_grads(lambda x, w: reference_grouped_matmul(x, w, gs, **options), (lhs, rhs), seed=7)
    assert got.dtype == jnp.dtype(dtype if out_dtype is None else out_dtype)
    assert_close(got, want, dtype, what=f"out {sizes}")
    for g, w, name in zip(grads, want_grads, ("lhs", "rhs"), strict=True):
        assert_close(g, w, dtype, what=f"d {name} {sizes}")


def reference_outer(x: Any, dy: Any, sizes: list[int]) -> np.ndarray:
    """``x_gᵀ · dy_g`` per group in float64 (rows past the sum in no group)."""
    ends = np.cumsum([0, *sizes])
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    return np.stack([x64[a:b].T @ dy64[a:b] for a, b in itertools.pairwise(ends)])


# ----------------------------------------------------------------------------------------------
# The work list and the tile walk (plain JAX)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", [1, 2])
@pytest.mark.parametrize("sizes,m", [([0, 300, 1, 0, 450, 100, 0, 49, 2048, 700, 0, 352], 4100), ([5], 5),
                                     ([0, 0], 10), ([128, 129, 7], 300), ([256, 256], 512)])
def test_work_list(sizes: list[int], m: int, pair: int) -> None:
    """Every row is in exactly one item of its group; with CTA pairs both items of a pair share a group; the
    real groups' items come first, the rows past the sum's last; each item's rows fit its 128-row tile."""
    group, start, stop, counts = (np.asarray(a) for a in mg._tiles(jnp.asarray(sizes, jnp.int32), m, pair))
    multiplied, total = (int(c) for c in counts)
    assert multiplied <= total <= len(group) and total % pair == 0 and multiplied % pair == 0
    assert (group[:multiplied] < len(sizes)).all() and (group[multiplied:total] == len(sizes)).all()
    ends = np.concatenate([[0], np.minimum(np.cumsum(sizes), m), [m]])
    seen = np.zeros(m, int)
    for i in range(total):
        g = group[i]
        assert ends[g] <= start[i] <= stop[i] <= ends[g + 1] and stop[i] <= start[i] // 8 * 8 + 128
        assert pair == 1 or group[i ^ 1] == g
        seen[start[i]:stop[i]] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("band", [1, 2, 4, 8])
def test_snake_visits_every_tile_once(band: int) -> None:
    """The banded walk covers the grid once, also when the band divides the columns (where jax's version
    divides by zero), and matches ``plgpu.planar_snake`` where that one is defined."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    for rows, cols in ((1, 1), (3, 8), (5, 6), (4, 9)):
        lin = jnp.arange(rows * cols, dtype=jnp.int32)
        r, c = (np.asarray(a) for a in mm.snake(lin, jnp.int32(rows), cols, band))
        assert sorted(zip(r.tolist(), c.tolist(), strict=True)) == [(i, j) for i in range(rows) for j in range(cols)]
        if cols % band:
            want = plgpu.planar_snake(lin, (rows, cols), 1, band)
            assert (r == np.asarray(want[0])).all() and (c == np.asarray(want[1])).all()


# ----------------------------------------------------------------------------------------------
# Interpret mode (CPU) or the GPU: small shapes
# ----------------------------------------------------------------------------------------------


@needs_kernel
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bfloat16", "float16"])
def test_conformance(dtype: Any) -> None:
    """The conformance suite's uneven, empty and trailing-row groups, bfloat16 and float16 (float32 is gated);
    one test per dtype, so that two pytest workers share them."""
    assert check_grouped_matmul("pallas", dtypes=(dtype,), cfg=choice()) == 5


CASES = [
    # Five row tiles over two CTAs: groups straddling tiles (both consumers' halves partly in a group, one
    # half wholly in one), an empty group between two others inside one tile, a group of one row, rows
    # past the sum (zeros), a ragged last tile; k of three steps with a 2-slot ring that wraps.
    (600, 192, 128, [70, 0, 1, 200, 0, 129, 100], jnp.bfloat16, None),
    # float16 in, float32 out; a single group covering every row (no mask anywhere); one column tile
    # narrower than the block (n = 40).
    (256, 64, 40, [256], jnp.float16, jnp.float32),
    # One row; every group empty but the last.
    (1, 64, 64, [0, 0, 1], jnp.bfloat16, None),
    # Chained pipelines: k of four steps and n of two (d lhs) with a 2-slot ring, several visits a CTA, empty
    # groups first and last, unaligned group starts, rows past the sum.
    (300, 256, 128, [0, 37, 100, 3, 50, 0], jnp.bfloat16, None),
]


@needs_kernel
@pytest.mark.parametrize("m,k,n,sizes,dtype,out_dtype", CASES, ids=lambda x: str(x) if isinstance(x, int) else None)
def test_matches_reference(m: int, k: int, n: int, sizes: list[int], dtype: Any, out_dtype: Any) -> None:
    check(m, k, n, sizes, dtype, cfg=MosaicGroupedMatmulConfig(block_n=64, split="m", stages=2),
          out_dtype=out_dtype)


@needs_kernel
def test_transposed_rhs_product() -> None:
    """``x · w[g]ᵀ`` (the backward's ``d lhs``) with a 3-slot ring, straddled tiles, ragged ``n``."""
    lhs, rhs, gs = _inputs(300, 128, 100, [120, 0, 30, 110], jnp.bfloat16, seed=3)
    rhs_t = jnp.swapaxes(rhs, 1, 2)  # [g, n, k]
    got = mg.grouped_product(lhs, rhs_t, gs, transpose_rhs=True, out_dtype=jnp.float32,
                             cfg=MosaicGroupedMatmulConfig(block_n=64, split="m", stages=3))
    assert_close(got, reference_grouped_matmul(lhs, rhs, gs, preferred_element_type=jnp.float32), jnp.bfloat16,
                 what="x @ w[g].T")


OUTER_CASES = [
    # Groups straddling 64-row steps at starts that are not multiples of 8, an empty group between two (its
    # gradient zero), a group of one row, rows past the sum; k and n not multiples of the tiles; both splits.
    (300, 130, 70, [61, 0, 1, 150, 30], "m"),
    (300, 130, 70, [61, 0, 1, 150, 30], "n"),
    # One group over every row (no edge step but the ragged tail); every group empty.
    (200, 128, 64, [200], "m"),
    (64, 64, 64, [0, 0], "m"),
]


@needs_kernel
@pytest.mark.parametrize("m,k,n,sizes,split", OUTER_CASES, ids=lambda x: str(x) if isinstance(x, (int, str)) else None)
def test_grouped_outer(m: int, k: int, n: int, sizes: list[int], split: str) -> None:
    """``d rhs = x_gᵀ · dy_g``: the contraction runs over each group's rows from its first row rounded down to 8;
    rows of other groups in a step are zeroed before the MMA."""
    rng = np.random.default_rng(11)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    # NaN in the rows past the sum: no group reads them, so none reaches an output.
    used = sum(sizes)
    x, dy = x.at[used:].set(jnp.nan), dy.at[used:].set(jnp.nan)
    block_n = 128 if split == "n" else 64
    got = go.grouped_outer(x, dy, jnp.asarray(sizes, jnp.int32), len(sizes), out_dtype=jnp.float32,
                           block_n=block_n, split=split, stages=2)
    assert got.shape == (len(sizes), k, n)
    assert_close(got, reference_outer(x, dy, sizes), jnp.bfloat16, what=f"d rhs {sizes} split {split}")


@needs_kernel
def test_under_vmap() -> None:
    """Each mapped problem has its own group sizes."""
    lhs, rhs, _ = _inputs(20, 16, 8, [0, 0, 0], jnp.bfloat16)
    lhs, rhs = jnp.stack([lhs, -lhs]), jnp.stack([rhs, 2 * rhs])
    gs = jnp.asarray([[5, 0, 11], [20, 0, 0]], jnp.int32)
    got = jax.vmap(lambda x, w, s: ejk.grouped_matmul(x, w, s, platform="pallas", cfg=choice()))(lhs, rhs, gs)
    assert_close(got, jax.vmap(reference_grouped_matmul)(lhs, rhs, gs), jnp.bfloat16, what="grouped under vmap")


@needs_kernel
@pytest.mark.skipif(ON_GPU, reason="the race detector is part of the CPU interpret mode")
def test_no_races(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter's race detector finds no unordered shared-memory access: the ring (2 slots over 3 k
    steps and several tiles), the output tile reused by the next tile, a straddled tile."""
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    monkeypatch.setattr(mg._fa, "interpret_params", lambda: InterpretGPUParams(detect_races=True))
    for k in (192, 256):  # a ring that wraps inside a visit; chained pipelines (4 steps, 2 slots)
        lhs, rhs, gs = _inputs(400, k, 64, [100, 0, 250, 20], jnp.bfloat16, seed=5)
        got = mg.grouped_product(lhs, rhs, gs, transpose_rhs=False, out_dtype=jnp.float32,
                                 cfg=MosaicGroupedMatmulConfig(block_n=64, split="m", stages=2))
        races = interpret_pallas_call.get_races()
        assert races.reads and not races.races_found
        assert_close(got, reference_grouped_matmul(lhs, rhs, gs, preferred_element_type=jnp.float32), jnp.bfloat16,
                     what=f"out, k {k}")
    lhs, dy = _inputs(400, 192, 64, [0], jnp.bfloat16, seed=6)[0], _inputs(400, 128, 64, [0], jnp.bfloat16, seed=7)[0]
    got = go.grouped_outer(lhs, dy, gs, 4, out_dtype=jnp.float32)
    races = interpret_pallas_call.get_races()
    assert races.reads and not races.races_found
    assert_close(got, reference_outer(lhs, dy, [100, 0, 250, 20]), jnp.bfloat16, what="d rhs")


@needs_kernel
@pytest.mark.skipif(ON_GPU, reason="the interpreter has no clusters; on a GPU they run")
def test_interpret_mode_refuses_clusters() -> None:
    lhs, rhs, gs = _inputs(64, 64, 64, [64], jnp.bfloat16)
    with pytest.raises(ValueError, match="cluster='none'"):
        mg.grouped_product(lhs, rhs, gs, transpose_rhs=False, out_dtype=jnp.bfloat16,
                           cfg=MosaicGroupedMatmulConfig(block_n=64, split="m", cluster="n"))


# ----------------------------------------------------------------------------------------------
# Gate and configs
# ----------------------------------------------------------------------------------------------


def test_gate() -> None:
    lhs, rhs, gs = sds((4096, 2048), jnp.bfloat16), sds((64, 2048, 1536), jnp.bfloat16), sds((64,), jnp.int32)
    assert "float32" in (mg.capability(sds((8, 8), jnp.float32), sds((1, 8, 8), jnp.float32), sds((1,), jnp.int32))
                         or "")
    assert "float16" in (mg.capability(lhs, sds((64, 2048, 1536), jnp.float16), gs) or "")
    assert "preferred_element_type int32" in (mg.capability(lhs, rhs, gs, preferred_element_type=jnp.int32) or "")
    assert "group_sizes of dtype float32" in (mg.capability(lhs, rhs, sds((64,), jnp.float32)) or "")
    why = mg.capability(lhs, rhs, gs)
    if not (ON_HOPPER or _env.use_interpreter()):
        assert why is not None and "sm_90" in why


def test_configs_fit_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)  # the GPU's space
    lhs, rhs, gs = sds((4096, 2048), jnp.bfloat16), sds((64, 2048, 1536), jnp.bfloat16), sds((64,), jnp.int32)
    for out in (None, jnp.float32):
        space = mg.config_space(lhs, rhs, gs, preferred_element_type=out)
        assert space[0] == mg.heuristic_config(lhs, rhs, gs, preferred_element_type=out)
        size = jnp.dtype(jnp.bfloat16 if out is None else out).itemsize
        assert space and all(mg.smem_bytes(c, 2, size) <= mg._SMEM_BUDGET for c in space)
    assert mg.heuristic_config(lhs, rhs, gs) == MosaicGroupedMatmulConfig(block_n=256, split="m", cluster="m",
                                                                         stages=4)
    assert mg.heuristic_config(lhs, rhs, gs, preferred_element_type=jnp.float32) == MosaicGroupedMatmulConfig(
        block_n=256, split="m", cluster="m", stages=3)
    space = mg.config_space(lhs, rhs, gs)
    assert {c.cluster for c in space} == {"none", "m", "n"} and {c.band for c in space} == {2, 8}
    assert len(set(space)) == len(space)
    with pytest.raises(ValueError):
        MosaicGroupedMatmulConfig(block_n=512)
    with pytest.raises(ValueError, match="split the other way"):
        MosaicGroupedMatmulConfig(block_n=64, split="n")  # 32-column halves


def test_registered() -> None:
    backend = "gpu"
    spec = ejk.kernel_registry.get_spec("grouped_matmul", platform="pallas", backend=backend, name="mosaic")
    assert spec.cfg_type is MosaicGroupedMatmulConfig
    assert spec.vjp is not None and spec.vjp.residuals == "grouped_matmul:inputs"


# ----------------------------------------------------------------------------------------------
# Lowering for CUDA on the CPU: every config, both rhs layouts, dtypes and output dtypes
# ----------------------------------------------------------------------------------------------


def _lower(cfg: MosaicGroupedMatmulConfig, transpose_rhs: bool, dtype: Any = jnp.bfloat16, out: Any = None,
           m: int = 1000, k: int = 300, n: int = 520) -> None:
    x = sds((m, k), dtype)
    w = sds((5, n, k) if transpose_rhs else (5, k, n), dtype)

    def f(x: Any, w: Any, gs: Any) -> Any:
        return mg.grouped_product(x, w, gs, transpose_rhs=transpose_rhs, out_dtype=out or dtype, cfg=cfg)

    text = jax.jit(f).trace(x, w, sds((5,), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text, "no Mosaic GPU custom call in the lowered module"


@pytest.mark.parametrize("transpose_rhs", [False, True], ids=["rhs", "rhs_t"])
@pytest.mark.parametrize("cfg", mg._fitting(sds((1, 1), jnp.bfloat16), jnp.bfloat16),
                         ids=lambda c: f"n{c.block_n}{c.split}c{c.cluster}s{c.stages}")
def test_every_config_lowers_for_cuda(cfg: MosaicGroupedMatmulConfig, transpose_rhs: bool,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    _lower(cfg, transpose_rhs)
    _lower(cfg, transpose_rhs, k=768)  # 12 steps: chained pipelines for every ring depth of the space


def test_float16_and_float32_out_lower_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    _lower(MosaicGroupedMatmulConfig(block_n=128, split="m", stages=2), False, jnp.float16, jnp.float32)
    _lower(MosaicGroupedMatmulConfig(cluster="n"), True, jnp.float16, m=5, k=20, n=3)  # every dim below one block


@pytest.mark.parametrize("split,block_n,out", [("m", 256, jnp.bfloat16), ("n", 256, jnp.bfloat16),
                                               ("n", 128, jnp.float32), ("m", 64, jnp.float16)])
def test_grouped_outer_lowers_for_cuda(split: str, block_n: int, out: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    dtype = jnp.float16 if out == jnp.float16 else jnp.bfloat16
    stages = 3 if out == jnp.float32 else 4
    assert go.smem_bytes(block_n, stages, 2, jnp.dtype(out).itemsize) <= mm._SMEM_BUDGET

    def f(x: Any, y: Any, gs: Any) -> Any:
        return go.grouped_outer(x, y, gs, 5, out_dtype=out, block_n=block_n, split=split, stages=stages)

    lowered = jax.jit(f).trace(sds((1000, 300), dtype), sds((1000, 520), dtype), sds((5,), jnp.int32))
    assert "mosaic_gpu" in lowered.lower(lowering_platforms=("cuda",)).as_text()
    assert go.heuristic(sds((8, 8), jnp.bfloat16), jnp.float32)["stages"] == 3  # float32 tiles take a slot


# ----------------------------------------------------------------------------------------------
# GPU (marker `gpu`): the compiled kernel at real sizes
# ----------------------------------------------------------------------------------------------

GPU_SIZES = [0, 300, 1, 0, 450, 100, 0, 49, 2048, 700, 0, 352]  # 4000 rows of 4100: the last 100 past the sum


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper GPU")
def test_gpu_every_config() -> None:
    lhs = sds((4100, 768), jnp.bfloat16)
    for cfg in mg.config_space(lhs, sds((12, 768, 1100), jnp.bfloat16), sds((12,), jnp.int32)):
        check(4100, 768, 1100, GPU_SIZES, jnp.bfloat16, cfg=cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("m,k,n,dtype,out", [(4100, 1000, 1004, jnp.float16, None), (333, 100, 20, jnp.bfloat16,
                                                                                      jnp.float32)])
def test_gpu_ragged_sizes(m: int, k: int, n: int, dtype: Any, out: Any) -> None:
    sizes = GPU_SIZES if m == 4100 else [0, 33, 0, 250]
    check(m, k, n, sizes, dtype, out_dtype=out)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("split", ["m", "n"])
def test_gpu_grouped_outer(split: str) -> None:
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((4100, 1000)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((4100, 1004)), jnp.bfloat16)
    got = go.grouped_outer(x, dy, jnp.asarray(GPU_SIZES, jnp.int32), len(GPU_SIZES), out_dtype=jnp.float32,
                           split=split, block_n=256, stages=3)
    assert_close(got, reference_outer(x, dy, GPU_SIZES), jnp.bfloat16, what=f"d rhs split {split}")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper GPU")
def test_gpu_conformance() -> None:
    check_grouped_matmul("pallas", dtypes=(jnp.bfloat16, jnp.float16), cfg=choice())
