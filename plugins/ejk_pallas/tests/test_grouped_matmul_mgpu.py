"""The Mosaic GPU grouped matmul (``pallas/gpu:mosaic`` for ``grouped_matmul``): values, gradients, gate, lowering.

On a CPU the kernel runs in Pallas's Mosaic GPU interpret mode (``EJK_PALLAS_INTERPRET=1``): the persistent
walk of the work list over two CTAs, the warp-specialised TMA ring, the per-group visits of tiles that
straddle groups and their ladders of row stores, the skipped empty groups and list entries, and the zero rows
past the sum are checked, with the MMAs as plain dots. Every config of the space is lowered through the real
Mosaic GPU lowering for CUDA (which checks the WGMMA operands, layouts, transforms and the TMA stores). Tests
marked ``gpu`` run the compiled kernel on a Hopper GPU.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_grouped_matmul, reference_grouped_matmul, values_and_grads
from ejk_pallas import _env
from ejk_pallas import _grouped_matmul_mgpu as mg
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
    lhs, rhs, gs = _inputs(400, 192, 64, [100, 0, 250, 20], jnp.bfloat16, seed=5)
    got = mg.grouped_product(lhs, rhs, gs, transpose_rhs=False, out_dtype=jnp.float32,
                             cfg=MosaicGroupedMatmulConfig(block_n=64, split="m", stages=2))
    races = interpret_pallas_call.get_races()
    assert races.reads and not races.races_found
    assert_close(got, reference_grouped_matmul(lhs, rhs, gs, preferred_element_type=jnp.float32), jnp.bfloat16,
                 what="out")


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
    assert mg.heuristic_config(lhs, rhs, gs) == MosaicGroupedMatmulConfig(block_n=256, split="n", stages=4)
    assert mg.heuristic_config(lhs, rhs, gs, preferred_element_type=jnp.float32) == MosaicGroupedMatmulConfig(
        block_n=256, split="n", stages=3)
    assert {c.cluster for c in mg.config_space(lhs, rhs, gs)} == {"none", "n"}
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


def test_float16_and_float32_out_lower_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "use_interpreter", lambda: False)
    _lower(MosaicGroupedMatmulConfig(block_n=128, split="m", stages=2), False, jnp.float16, jnp.float32)
    _lower(MosaicGroupedMatmulConfig(cluster="n"), True, jnp.float16, m=5, k=20, n=3)  # every dim below one block


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
def test_gpu_conformance() -> None:
    check_grouped_matmul("pallas", dtypes=(jnp.bfloat16, jnp.float16), cfg=choice())
