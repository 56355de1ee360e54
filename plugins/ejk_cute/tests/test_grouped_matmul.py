"""The CuTe grouped matmul: every config compiles for sm_90a (on any host), work list, gate, configs, GPU numerics.

On a CPU the kernels cannot run: the compile tests lower the forward and backward for CUDA with
``jax.export`` (``_compile.export_for_cuda``), which compiles every kernel for sm_90a; the work
list the kernels walk (``plan``) is checked against a model of the kernel's walk. Tests marked
``gpu`` check the output and both gradients against the float32 reference.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk import kernel_registry
from ejk.testing import assert_close, reference_grouped_matmul
from ejk_cute import _compile, _device, _grouped_matmul, _status
from ejk_cute._grouped_matmul import (
    GroupedMatmulConfig,
    capability,
    config_space,
    heuristic_config,
    plan,
    shape_reason,
)

S = jax.ShapeDtypeStruct
needs_cutlass = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                   reason="nvidia-cutlass-dsl not installed")
DTYPES = (jnp.bfloat16, jnp.float16)
#: m, k, n and 3 groups: no dim a multiple of a tile.
M, K, N, G = 200, 136, 264, 3
SPACE = config_space(S((M, K), jnp.bfloat16), S((G, K, N), jnp.bfloat16), S((G,), jnp.int32))


def _label(cfg: GroupedMatmulConfig) -> str:
    return f"{cfg.tile_m}x{cfg.tile_n}c{cfg.cluster_m}s{cfg.stages}"


def _kernels_in(fn: Any, *args: Any) -> list[str]:
    return list(_compile.kernel_calls(_compile.export_for_cuda(fn, *args)))


# ----------------------------------------------------------------------------------------------
# Compile path (CPU or GPU): the kernels compile for sm_90a
# ----------------------------------------------------------------------------------------------


@needs_cutlass
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("cfg", SPACE, ids=_label)
def test_every_config_compiles_forward(cfg: GroupedMatmulConfig, dtype: Any) -> None:
    def f(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
        return _grouped_matmul.forward(lhs, rhs, sizes, cfg=cfg)

    assert len(_kernels_in(f, S((M, K), dtype), S((G, K, N), dtype), S((G,), jnp.int32))) == 1


@needs_cutlass
@pytest.mark.parametrize("cluster", _grouped_matmul.CLUSTERS, ids=lambda c: f"cluster{c}")
@pytest.mark.parametrize("tile", _grouped_matmul.TILES, ids=str)
def test_backward_compiles(tile: tuple[int, int], cluster: int) -> None:
    """``d lhs`` (the grouped kernel on ``rhs`` transposed) and ``d rhs`` (the ragged-reduction kernel)."""
    cfg = _grouped_matmul.deepest(*tile, cluster)

    def f(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array, dy: jax.Array) -> tuple[Any, ...]:
        return _grouped_matmul.vjp.bwd((lhs, rhs, sizes), dy, cfg=cfg)

    args = (S((M, K), jnp.bfloat16), S((G, K, N), jnp.bfloat16), S((G,), jnp.int32), S((M, N), jnp.bfloat16))
    d_lhs, d_rhs, d_sizes = jax.eval_shape(f, *args)
    assert (d_lhs.shape, d_rhs.shape, d_sizes) == ((M, K), (G, K, N), None)
    assert len(_kernels_in(f, *args)) == 2


@needs_cutlass
def test_float32_output_compiles() -> None:
    def f(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
        return _grouped_matmul.forward(lhs, rhs, sizes, preferred_element_type=jnp.float32, cfg=SPACE[0])

    assert len(_kernels_in(f, S((M, K), jnp.float16), S((G, K, N), jnp.float16), S((G,), jnp.int32))) == 1


def test_empty_problems_are_zeros_without_a_launch() -> None:
    cfg = GroupedMatmulConfig()
    sizes = jnp.asarray([2, 3], jnp.int32)
    out = _grouped_matmul.forward(jnp.ones((6, 0), jnp.bfloat16), jnp.ones((2, 0, 8), jnp.bfloat16), sizes, cfg=cfg)
    assert out.shape == (6, 8) and not np.asarray(out, np.float32).any()
    out = _grouped_matmul.forward(jnp.ones((6, 8), jnp.bfloat16), jnp.ones((0, 8, 8), jnp.bfloat16),
                                  jnp.zeros((0,), jnp.int32), cfg=cfg)
    assert out.shape == (6, 8) and not np.asarray(out, np.float32).any()
    d_rhs = _grouped_matmul.outer(jnp.ones((0, 8), jnp.bfloat16), jnp.ones((0, 16), jnp.bfloat16), sizes, 2,
                                  out_dtype=jnp.bfloat16, cfg=cfg)
    assert d_rhs.shape == (2, 8, 16) and not np.asarray(d_rhs, np.float32).any()


def test_product_names_bad_operands() -> None:
    cfg = GroupedMatmulConfig()
    sizes = jnp.asarray([4], jnp.int32)
    with pytest.raises(ValueError, match=r"x \[m, k\] and w \[g, k, n\]"):
        _grouped_matmul.product(jnp.ones((1, 8, 8)), jnp.ones((1, 8, 8)), sizes, out_dtype=jnp.float32, cfg=cfg)
    with pytest.raises(ValueError, match="contraction sizes differ"):
        _grouped_matmul.product(jnp.ones((8, 16)), jnp.ones((1, 8, 8)), sizes, out_dtype=jnp.float32, cfg=cfg)


# ----------------------------------------------------------------------------------------------
# The work list (computed on the device before the launch) against a model of the kernel's walk
# ----------------------------------------------------------------------------------------------


def _walk(rows: np.ndarray, items: np.ndarray, cfg: GroupedMatmulConfig, n: int) -> np.ndarray:
    """How often each output element is stored (a model of ``GroupedGemm._item`` and the masked epilogue)."""
    m = int(rows[-1])
    stores = np.zeros((m, n), np.int64)
    band = cfg.tile_m * cfg.cluster_m
    g = 0
    for w in range(int(items[-1])):
        while items[g + 1] <= w:
            g += 1
        start, end = int(rows[g]), int(rows[g + 1])
        row_tiles = (end - start + band - 1) // band
        local = w - int(items[g])
        col = local // row_tiles
        for x in range(cfg.cluster_m):  # the CTAs of one cluster
            row0 = start + ((local - col * row_tiles) * cfg.cluster_m + x) * cfg.tile_m
            lo, hi = max(row0, 0), min(row0 + cfg.tile_m, end)
            stores[lo:hi, col * cfg.tile_n:min((col + 1) * cfg.tile_n, n)] += 1
    return stores


@pytest.mark.parametrize("cluster", (1, 2))
@pytest.mark.parametrize(("m", "sizes"), [
    (1000, [128, 0, 300, 1, 500]),  # empty and one-row groups, rows past the sum
    (640, [0, 640, 0]),  # one group with every row
    (300, [0, 0]),  # no row in a group: the tail only
    (256, [100, 200, 50]),  # sizes past m are clipped
    (257, [-5, 257]),  # negative sizes count as 0
], ids=str)
def test_work_list_stores_every_element_once(m: int, sizes: list[int], cluster: int) -> None:
    cfg = GroupedMatmulConfig(tile_m=128, tile_n=128, cluster_m=cluster)
    n = 264
    rows, items = (np.asarray(x) for x in plan(jnp.asarray(sizes, jnp.int32), m, n, cfg))
    assert rows.shape == items.shape == (len(sizes) + 2,)
    assert rows[0] == 0 and rows[-1] == m and (np.diff(rows) >= 0).all()
    assert (np.diff(items) >= 0).all()
    assert (_walk(rows, items, cfg, n) == 1).all()
    bound = (-(-m // (cfg.tile_m * cluster)) + len(sizes) + 1) * -(-n // cfg.tile_n)  # the kernel's grid bound
    assert items[-1] <= bound


# ----------------------------------------------------------------------------------------------
# Gate, configs, registration (no device needed)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sl", "sr", "dl", "dr", "ds", "out", "why"), [
    ((64, 64), (4, 64, 64), "bfloat16", "bfloat16", "int32", None, None),
    ((7, 16), (3, 16, 8), "float16", "float16", "int32", "float32", None),  # any m
    ((64, 64), (4, 64, 64), "float32", "float32", "int32", None, "float32 not supported"),
    ((64, 64), (4, 64, 64), "bfloat16", "float16", "int32", None, "share a dtype"),
    ((64, 64), (4, 64, 64), "bfloat16", "bfloat16", "float32", None, "group_sizes of dtype float32"),
    ((64, 60), (4, 60, 64), "bfloat16", "bfloat16", "int32", None, "k = 60 is not a multiple of 8"),
    ((64, 64), (4, 64, 36), "bfloat16", "bfloat16", "int32", None, "n = 36 is not a multiple of 8"),
    ((64, 64), (4, 64, 64), "bfloat16", "bfloat16", "int32", "int8", "preferred_element_type int8"),
    ((2**16, 2**15), (1, 2**15, 64), "bfloat16", "bfloat16", "int32", None, "2**31"),
], ids=str)
def test_gate_names_what_it_refuses(sl: tuple[int, ...], sr: tuple[int, ...], dl: str, dr: str, ds: str,
                                    out: str | None, why: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    lhs, rhs, sizes = S(sl, jnp.dtype(dl)), S(sr, jnp.dtype(dr)), S(sr[:1], jnp.dtype(ds))
    reason = shape_reason(lhs, rhs, sizes, out)
    assert reason is None if why is None else why in (reason or ""), reason
    monkeypatch.setattr(_status, "runtime_reason", lambda: None)
    assert capability(lhs, rhs, sizes, preferred_element_type=out) == reason


def test_gate_starts_with_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_status, "runtime_reason", lambda: "needs sm_90+ (Hopper or newer): this GPU is sm_80")
    args = (S((64, 64), jnp.bfloat16), S((2, 64, 64), jnp.bfloat16), S((2,), jnp.int32))
    assert capability(*args) == "needs sm_90+ (Hopper or newer): this GPU is sm_80"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU answer")
def test_gate_refuses_a_cpu() -> None:
    reason = capability(S((64, 64), jnp.bfloat16), S((2, 64, 64), jnp.bfloat16), S((2,), jnp.int32))
    assert reason is not None and ("sm_90" in reason or "nvidia-cutlass-dsl" in reason)


@pytest.mark.parametrize(("fields", "match"), [
    ({"tile_m": 256}, "tile_m"), ({"tile_n": 64}, "tile_n"), ({"cluster_m": 4}, "cluster_m"), ({"stages": 1}, "stages"),
], ids=str)
def test_config_validation(fields: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GroupedMatmulConfig(**fields)


def test_space_covers_tiles_and_clusters_within_shared_memory() -> None:
    assert len(SPACE) == len(_grouped_matmul.TILES) * len(_grouped_matmul.CLUSTERS) == len(set(SPACE))
    assert {(c.tile_m, c.tile_n) for c in SPACE} == set(_grouped_matmul.TILES)
    assert {c.cluster_m for c in SPACE} == set(_grouped_matmul.CLUSTERS)
    limit = _device.smem_capacity()
    for cfg in SPACE:
        assert _grouped_matmul.smem_bytes(cfg) <= limit
        assert cfg.stages == 6 or _grouped_matmul.smem_bytes(attrs.evolve(cfg, stages=cfg.stages + 1)) > limit


@pytest.mark.parametrize(("m", "g", "n", "tile_n", "cluster"), [
    (32768, 64, 1536, 256, 2),  # 512-row groups: 256 row tiles x 6 column tiles cover the SMs
    (4096, 64, 1536, 256, 1),  # 64-row groups: one row tile each, no second CTA for a cluster
    (2048, 8, 512, 128, 2),  # 16 x 4 tiles of 256 columns would leave SMs idle
], ids=str)
def test_heuristic(m: int, g: int, n: int, tile_n: int, cluster: int) -> None:
    args = (S((m, 2048), jnp.bfloat16), S((g, 2048, n), jnp.bfloat16), S((g,), jnp.int32))
    cfg = heuristic_config(*args)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m) == (128, tile_n, cluster)
    assert config_space(*args)[0] == cfg


def test_registered_for_the_gpu_with_its_vjp() -> None:
    (spec,) = [s for s in kernel_registry.list_implementations("grouped_matmul") if s.platform == "cute"]
    assert spec.label == "cute/gpu:grouped"
    assert spec.cfg_type is GroupedMatmulConfig and spec.capability is capability
    assert spec.vjp is not None and spec.vjp.residuals == "grouped_matmul:inputs"
    assert kernel_registry.validate_signatures("grouped_matmul")


# ----------------------------------------------------------------------------------------------
# GPU: numerics and gradients against the float32 reference
# ----------------------------------------------------------------------------------------------

#: One shape, several group patterns (group sizes are data: one compile per kernel).
GPU_M, GPU_K, GPU_N = 1000, 264, 392
GPU_SIZES = {
    "equal": [200, 200, 200, 200, 200],
    "skewed": [3, 700, 1, 150, 146],
    "empty groups, rows past the sum": [0, 300, 0, 0, 390],
    "one group has every row": [0, 0, 1000, 0, 0],
    "no row in a group": [0, 0, 0, 0, 0],
}


def _loop_reference(lhs: jax.Array, rhs: jax.Array, sizes: np.ndarray, out_dtype: Any = None) -> jax.Array:
    """The grouped product in float32 as one dense matmul per group (static sizes): a cheap reference for
    shapes where ``reference_grouped_matmul``'s per-row gather of ``rhs`` would not fit in memory."""
    starts = np.concatenate([[0], np.cumsum(sizes)])
    parts = [jnp.matmul(lhs[starts[i]:starts[i + 1]].astype(jnp.float32), rhs[i].astype(jnp.float32),
                        precision="highest") for i in range(len(sizes))]
    tail = jnp.zeros((lhs.shape[0] - int(starts[-1]), rhs.shape[2]), jnp.float32)
    return jnp.concatenate([*parts, tail]).astype(out_dtype or lhs.dtype)


def _gradients(sizes: np.ndarray, cfg: Any, dtype: Any = jnp.bfloat16, out_dtype: Any = None, m: int = GPU_M,
               k: int = GPU_K, n: int = GPU_N, seed: int = 0, loop_reference: bool = False) -> None:
    """Output, d lhs and d rhs of ``ejk.grouped_matmul(platform="cute")`` against the float32 reference."""
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m, k), np.float32), dtype)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n), np.float32), dtype)
    cot = jnp.asarray(rng.standard_normal((m, n), np.float32), out_dtype or dtype)
    group_sizes = jnp.asarray(sizes, jnp.int32)

    def ours(lhs: jax.Array, rhs: jax.Array, cot: jax.Array, group_sizes: jax.Array) -> tuple[jax.Array, ...]:
        out, pull = jax.vjp(lambda a, b: ejk.grouped_matmul(a, b, group_sizes, platform="cute", cfg=cfg,
                                                            preferred_element_type=out_dtype), lhs, rhs)
        return (out, *pull(cot))

    def ref(a: jax.Array, b: jax.Array) -> jax.Array:
        if loop_reference:
            return _loop_reference(a, b, sizes, out_dtype)
        return reference_grouped_matmul(a, b, group_sizes, preferred_element_type=out_dtype)

    def reference(lhs: jax.Array, rhs: jax.Array, cot: jax.Array) -> tuple[jax.Array, ...]:
        out, pull = jax.vjp(ref, lhs, rhs)
        return (out, *pull(cot))

    got = jax.jit(ours)(lhs, rhs, cot, group_sizes)
    wanted = jax.jit(reference)(lhs, rhs, cot)  # one compile (eagerly, each group's products compiled apart)
    assert not np.asarray(got[0][int(sizes.sum()):], np.float32).any(), "rows past the sum must be zeros"
    for name, g, want in zip(("out", "d lhs", "d rhs"), got, wanted, strict=True):
        assert g.dtype == want.dtype, name
        assert_close(g, want, dtype, what=name)


def _skewed(groups: int, m: int, seed: int) -> np.ndarray:
    """A Dirichlet split of ``m`` rows (every row in a group), as ``ejk.bench``'s skewed MoE case."""
    sizes = np.floor(np.random.default_rng(seed).dirichlet(np.ones(groups)) * m).astype(np.int64)
    sizes[0] += m - int(sizes.sum())
    return sizes


@pytest.mark.gpu
def test_group_patterns_on_gpu() -> None:
    """Equal, skewed, empty groups, one group with all rows, rows past the sum; output and gradients."""
    for label, sizes in GPU_SIZES.items():
        try:
            _gradients(np.asarray(sizes), None)
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from exc


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SPACE, ids=_label)
def test_every_config_on_gpu(cfg: GroupedMatmulConfig) -> None:
    """16 skewed groups over 4096 rows, n 1032: several items per CTA, a partial column tile, every K edge."""
    sizes = _skewed(16, 4000, seed=1)  # 96 rows past the sum
    _gradients(sizes, cfg, m=4096, k=264, n=1032, seed=1, loop_reference=True)


@pytest.mark.gpu
def test_float16_with_float32_output_on_gpu() -> None:
    _gradients(np.asarray(GPU_SIZES["empty groups, rows past the sum"]), None, jnp.float16, jnp.float32)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("ejk_triton") is None, reason="ejk-triton not installed")
def test_forward_pairs_with_the_triton_backward_on_gpu() -> None:
    """``ImplChoice(backward=...)``: the CuTe forward's residuals feed ejk-triton's backward."""
    sizes = jnp.asarray(GPU_SIZES["skewed"], jnp.int32)
    rng = np.random.default_rng(3)
    lhs, rhs = (jnp.asarray(rng.standard_normal(s, np.float32), jnp.bfloat16) for s in ((GPU_M, GPU_K),
                                                                                        (5, GPU_K, GPU_N)))
    choice = ejk.ImplChoice(platform="cute", backend="gpu", implementation="grouped",
                            backward=ejk.ImplChoice(platform="triton", backend="gpu", implementation="persistent"))

    def loss(fn: Any) -> Any:
        return jax.jit(jax.grad(lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32) ** 2), argnums=(0, 1)))

    got = loss(lambda a, b: ejk.grouped_matmul(a, b, sizes, platform="cute", cfg=choice))(lhs, rhs)
    want = loss(lambda a, b: reference_grouped_matmul(a, b, sizes))(lhs, rhs)
    for name, g, w in zip(("d lhs", "d rhs"), got, want, strict=True):
        assert_close(g, w, jnp.bfloat16, what=name)
@pytest.mark.gpu
def test_gate_on_this_gpu() -> None:
    args = (S((64, 64), jnp.bfloat16), S((2, 64, 64), jnp.bfloat16), S((2,), jnp.int32))
    if _device.arch_reason() is not None:
        reason = capability(*args)
        assert reason is not None and "sm_90" in reason
    else:
        assert capability(*args) is None
