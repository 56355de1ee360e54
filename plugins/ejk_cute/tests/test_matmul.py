"""The CuTe Hopper matmul: every config compiles for sm_90a (on any host), gate, configs, and GPU numerics.

On a CPU the kernel cannot run, so the CPU tests lower the kernel for CUDA with ``jax.export``
(``_compile.export_for_cuda``), which compiles it for sm_90a into the HLO: DSL errors, layout and
shared-memory mistakes surface here. They call the implementation directly (the gate would refuse
a CPU). Tests marked ``gpu`` check numerics and gradients against the float32 reference.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk import kernel_registry
from ejk.testing import assert_close, check_matmul, reference_matmul
from ejk_cute import _compile, _device, _matmul, _status
from ejk_cute._matmul import MatmulConfig, capability, config_space, heuristic_config, shape_reason

S = jax.ShapeDtypeStruct
needs_cutlass = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                   reason="nvidia-cutlass-dsl not installed")
DTYPES = (jnp.bfloat16, jnp.float16)
#: No dim a multiple of any tile: TMA's zero fill and clipped stores at every edge.
RAGGED = ((200, 136), (136, 264))
SPACE = config_space(S(*RAGGED[:1], jnp.bfloat16), S(RAGGED[1], jnp.bfloat16))


def _kernels_in(fn: Any, *args: Any) -> list[str]:
    return list(_compile.kernel_calls(_compile.export_for_cuda(fn, *args)))


# ----------------------------------------------------------------------------------------------
# Compile path (CPU or GPU): the kernel compiles for sm_90a
# ----------------------------------------------------------------------------------------------


@needs_cutlass
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("cfg", SPACE, ids=lambda c: f"{c.tile_m}x{c.tile_n}c{c.cluster_m}{c.cluster_n}s{c.stages}")
def test_every_config_compiles_forward(cfg: MatmulConfig, dtype: Any) -> None:
    (sa, sb) = RAGGED

    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        return _matmul.forward(a, b, preferred_element_type=dtype, cfg=cfg)

    assert len(_kernels_in(f, S(sa, dtype), S(sb, dtype))) == 1


@needs_cutlass
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("tile", _matmul.TILES, ids=str)
def test_backward_compiles_with_transposed_operands(tile: tuple[int, int], dtype: Any) -> None:
    """``d a = d c @ bᵀ`` (b read K-major) and ``d b = aᵀ @ d c`` (a read M-major): two launches."""
    cfg = _matmul.deepest(*tile, 1, 1)
    (sa, sb) = RAGGED

    def f(a: jax.Array, b: jax.Array, dc: jax.Array) -> tuple[jax.Array, jax.Array]:
        return _matmul.vjp.bwd((a, b), dc, cfg=cfg)  # type: ignore[misc]

    assert len(_kernels_in(f, S(sa, dtype), S(sb, dtype), S((sa[0], sb[1]), dtype))) == 2


@needs_cutlass
@pytest.mark.parametrize(("sa", "sb"), [
    ((3, 41, 24), (24, 56)),  # a's batch folds into its rows (123 rows: m need not be aligned)
    ((3, 1, 41, 24), (2, 24, 56)),  # broadcast batches: the kernel's L mode, float32 partial gradients
    ((24,), (2, 24, 16)),  # 1-D a: one row
], ids=str)
def test_batched_shapes_compile_forward_and_backward(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    cfg = MatmulConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, stages=4)

    def f(a: jax.Array, b: jax.Array) -> tuple[jax.Array, ...]:
        out, res = _matmul.vjp.fwd(a, b, cfg=cfg)
        return (out, *_matmul.vjp.bwd(res, jnp.ones_like(out), cfg=cfg))

    out = jax.eval_shape(f, S(sa, jnp.bfloat16), S(sb, jnp.bfloat16))
    assert out[0].shape == jnp.matmul(jnp.zeros(sa), jnp.zeros(sb)).shape
    assert (out[1].shape, out[2].shape) == (sa, sb)
    assert len(_kernels_in(f, S(sa, jnp.bfloat16), S(sb, jnp.bfloat16))) == 3


@needs_cutlass
def test_float32_output_compiles() -> None:
    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        return _matmul.forward(a, b, preferred_element_type=jnp.float32, cfg=SPACE[0])

    assert len(_kernels_in(f, S(RAGGED[0], jnp.float16), S(RAGGED[1], jnp.float16))) == 1


def test_empty_products_are_zeros_without_a_launch() -> None:
    cfg = MatmulConfig()
    out = _matmul.forward(jnp.ones((4, 0), jnp.bfloat16), jnp.ones((0, 8), jnp.bfloat16), cfg=cfg)
    assert out.shape == (4, 8) and not np.asarray(out, np.float32).any()
    assert _matmul.forward(jnp.ones((0, 8), jnp.bfloat16), jnp.ones((8, 8), jnp.bfloat16), cfg=cfg).shape == (0, 8)


def test_product_names_bad_operands() -> None:
    cfg = MatmulConfig()
    with pytest.raises(ValueError, match=r"\[L, r, c\] operands"):
        _matmul.product(jnp.ones((8, 8)), jnp.ones((1, 8, 8)), out_dtype=jnp.float32, cfg=cfg)
    with pytest.raises(ValueError, match="contraction sizes differ"):
        _matmul.product(jnp.ones((1, 8, 16)), jnp.ones((1, 8, 8)), out_dtype=jnp.float32, cfg=cfg)


# ----------------------------------------------------------------------------------------------
# Gate, configs, registration (no device needed)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sa", "sb", "da", "db", "out", "why"), [
    ((64, 64), (64, 64), "bfloat16", "bfloat16", None, None),
    ((5, 3, 64), (64, 8), "float16", "float16", "float32", None),  # any m, batch folded
    ((2, 1, 7, 16), (3, 16, 24), "bfloat16", "bfloat16", "bfloat16", None),
    ((64,), (64, 64), "bfloat16", "bfloat16", None, None),
    ((64, 64), (64, 64), "float32", "float32", None, "float32 not supported"),
    ((64, 64), (64, 64), "bfloat16", "float16", None, "share a dtype"),
    ((64, 60), (60, 64), "bfloat16", "bfloat16", None, "k = 60 is not a multiple of 8"),
    ((64, 64), (64, 36), "bfloat16", "bfloat16", None, "n = 36 is not a multiple of 8"),
    ((64, 64), (64,), "bfloat16", "bfloat16", None, "1-D b"),
    ((64, 64), (64, 64), "bfloat16", "bfloat16", "int8", "preferred_element_type int8"),
], ids=str)
def test_gate_names_what_it_refuses(sa: tuple[int, ...], sb: tuple[int, ...], da: str, db: str, out: str | None,
                                    why: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = S(sa, jnp.dtype(da)), S(sb, jnp.dtype(db))
    reason = shape_reason(a, b, out)
    assert reason is None if why is None else why in (reason or ""), reason
    monkeypatch.setattr(_status, "runtime_reason", lambda: None)
    assert capability(a, b, preferred_element_type=out) == reason


def test_gate_refuses_huge_operands() -> None:
    reason = shape_reason(S((2**16, 2**16), jnp.bfloat16), S((2**16, 64), jnp.bfloat16))
    assert reason is not None and "2**31" in reason


def test_gate_starts_with_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_status, "runtime_reason", lambda: "needs sm_90+ (Hopper or newer): this GPU is sm_80")
    assert capability(S((64, 64), jnp.bfloat16), S((64, 64), jnp.bfloat16)) == (
        "needs sm_90+ (Hopper or newer): this GPU is sm_80")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks the CPU answer")
def test_gate_refuses_a_cpu() -> None:
    reason = capability(S((64, 64), jnp.bfloat16), S((64, 64), jnp.bfloat16))
    assert reason is not None and ("sm_90" in reason or "nvidia-cutlass-dsl" in reason)


@pytest.mark.parametrize(("fields", "match"), [
    ({"tile_m": 256, "tile_n": 256}, "too many accumulator registers"),
    ({"tile_m": 64, "tile_n": 64}, "tile_n >= 128"),
    ({"tile_m": 96}, "tile_m"),
    ({"cluster_m": 4}, "cluster_m"),
    ({"stages": 1}, "stages"),
    ({"swizzle": 3}, "swizzle"),
], ids=str)
def test_config_validation(fields: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MatmulConfig(**fields)


def test_space_covers_tiles_and_clusters_within_shared_memory() -> None:
    assert len(SPACE) == len(_matmul.TILES) * len(_matmul.CLUSTERS) == len(set(SPACE))
    assert {(c.tile_m, c.tile_n) for c in SPACE} == set(_matmul.TILES)
    assert {(c.cluster_m, c.cluster_n) for c in SPACE} == set(_matmul.CLUSTERS)
    for cfg in SPACE:
        assert _matmul.smem_bytes(cfg) <= _device.smem_capacity()
        deeper = attrs_evolve(cfg, stages=cfg.stages + 1)
        assert cfg.stages == 6 or _matmul.smem_bytes(deeper) > _device.smem_capacity()
    assert _matmul.deepest(128, 256, 2, 1).stages == 4
    assert _matmul.deepest(128, 128, 1, 1).stages == 6
    # A float32 epilogue takes more shared memory than a 16-bit one, never less.
    assert _matmul.deepest(128, 256, 1, 1, out_itemsize=4).stages <= _matmul.deepest(128, 256, 1, 1).stages


def attrs_evolve(cfg: MatmulConfig, **changes: int) -> MatmulConfig:
    import attrs

    return attrs.evolve(cfg, **changes)


@pytest.mark.parametrize(("sa", "sb", "tile", "cluster"), [
    ((8192, 8192), (8192, 8192), (128, 256), (2, 1)),
    ((8192, 2048), (2048, 1024), (256, 128), (1, 2)),  # n the small side
    ((4, 512, 64), (64, 512), (128, 128), (1, 1)),  # 64 tiles of 128x256 would leave SMs idle
    ((8, 1024, 64), (8, 64, 1024), (128, 256), (2, 1)),  # batch counts in the tile count
], ids=str)
def test_heuristic(sa: tuple[int, ...], sb: tuple[int, ...], tile: tuple[int, int], cluster: tuple[int, int]) -> None:
    cfg = heuristic_config(S(sa, jnp.bfloat16), S(sb, jnp.bfloat16))
    assert ((cfg.tile_m, cfg.tile_n), (cfg.cluster_m, cfg.cluster_n)) == (tile, cluster)
    assert config_space(S(sa, jnp.bfloat16), S(sb, jnp.bfloat16))[0] == cfg


def test_registered_for_the_gpu_with_its_vjp() -> None:
    (spec,) = [s for s in kernel_registry.list_implementations("matmul") if s.platform == "cute"]
    assert spec.label == "cute/gpu:wgmma"
    assert spec.cfg_type is MatmulConfig and spec.vjp is not None and spec.vjp.residuals == "matmul:inputs"
    assert spec.capability is capability and spec.priority < 0
    assert kernel_registry.validate_signatures("matmul")


# ----------------------------------------------------------------------------------------------
# GPU: numerics and gradients against the float32 reference
# ----------------------------------------------------------------------------------------------

GPU_SHAPES = (
    ((200, 136), (136, 264)),  # ragged: no dim a multiple of a tile
    ((3, 77, 64), (64, 40)),  # a's batch folds into its rows
    ((2, 1, 65, 24), (3, 24, 16)),  # broadcast batches, float32 partial gradients
    ((1000, 1032), (1032, 776)),  # several tiles, K not a multiple of 64
)


def _one_program(cfg: Any) -> Any:
    """Output and both gradients of ``ejk.matmul(platform="cute")`` in one jitted program."""
    def fn(a: jax.Array, b: jax.Array, cot: jax.Array) -> tuple[jax.Array, ...]:
        out, pull = jax.vjp(lambda a, b: ejk.matmul(a, b, platform="cute", cfg=cfg), a, b)
        return (out, *pull(cot))

    return jax.jit(fn)


@pytest.mark.gpu
def test_conformance_on_gpu() -> None:
    assert check_matmul("cute", dtypes=(jnp.bfloat16,), shapes=GPU_SHAPES) == len(GPU_SHAPES)
    assert check_matmul("cute", dtypes=(jnp.float16,), shapes=GPU_SHAPES[:2], preferred_element_type=jnp.float32) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", SPACE, ids=lambda c: f"{c.tile_m}x{c.tile_n}c{c.cluster_m}{c.cluster_n}s{c.stages}")
def test_every_config_on_gpu(cfg: MatmulConfig) -> None:
    """Batched (the kernel's L), several tiles per SM, every edge ragged; output and gradients."""
    rng = np.random.default_rng(0)
    a, b, cot = (jnp.asarray(rng.standard_normal(shape, np.float32), jnp.bfloat16)
                 for shape in ((2, 520, 264), (2, 264, 392), (2, 520, 392)))
    got = _one_program(cfg)(a, b, cot)
    out, pull = jax.vjp(reference_matmul, a, b)
    for name, g, want in zip(("out", "da", "db"), got, (out, *pull(cot)), strict=True):
        assert_close(g, want, jnp.bfloat16, what=name)


@pytest.mark.gpu
def test_large_product_on_gpu() -> None:
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((4096, 2048), np.float32), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((2048, 4096), np.float32), jnp.bfloat16)
    got = jax.jit(lambda a, b: ejk.matmul(a, b, platform="cute"))(a, b)
    assert_close(got, reference_matmul(a, b), jnp.bfloat16)


@pytest.mark.gpu
def test_gate_on_this_gpu() -> None:
    if _device.arch_reason() is not None:
        reason = capability(S((64, 64), jnp.bfloat16), S((64, 64), jnp.bfloat16))
        assert reason is not None and "sm_90" in reason
    else:
        assert capability(S((64, 64), jnp.bfloat16), S((64, 64), jnp.bfloat16)) is None
