"""The Triton matmul against jnp.matmul in float32: shapes, gradients, dtypes, precision, gates, configs.

On a CPU the kernel runs through Triton's interpreter (``EJK_TRITON_INTERPRET=1``, see conftest.py);
tests marked ``gpu`` run larger shapes compiled on an NVIDIA GPU.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.config.serialization import from_jsonable, to_jsonable
from ejk.plugin import cdiv
from ejk.testing import MATMUL_SHAPES, assert_close, check_matmul, check_op, reference_matmul
from ejk_triton import _device, _dots, _env, _matmul
from ejk_triton._matmul import MatmulConfig, capability, config_space, heuristic_config, kernel_args

ON_GPU = _env.nvidia_gpu()[0]
# Each case compiles the kernel's and the reference's programs: cheap XLA CPU optimisation keeps the file fast.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")
#: Small tiles: several tiles per dim (masked edges, grouped order) on small shapes.
SMALL = MatmulConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2)


def vjp_of(fn: Any, *args: jax.Array) -> tuple[jax.Array, Any]:
    """``jax.vjp`` of ``fn`` with the output and the pullback each one jitted program."""
    out = jax.jit(fn, compiler_options=None if ON_GPU else FAST_COMPILE)(*args)
    pullback = jax.jit(lambda cot: jax.vjp(fn, *args)[1](cot), compiler_options=None if ON_GPU else FAST_COMPILE)
    return out, pullback


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)


def check_against_reference(a: jax.Array, b: jax.Array, *, cfg: Any = SMALL, tol_dtype: Any = None,
                            **options: Any) -> None:
    """Output and both gradients of ``ejk.matmul(platform="triton")`` against the float32 reference."""
    def ours(a: jax.Array, b: jax.Array) -> jax.Array:
        return ejk.matmul(a, b, platform="triton", cfg=cfg, **options)

    def ref(a: jax.Array, b: jax.Array) -> jax.Array:
        return reference_matmul(a, b, **options)

    out, vjp = vjp_of(ours, a, b)
    want, ref_vjp = vjp_of(ref, a, b)
    assert (out.shape, out.dtype) == (want.shape, want.dtype)
    dtype = tol_dtype or jnp.result_type(a, b)
    assert_close(out, want, dtype)
    cot = _normal(np.random.default_rng(5), out.shape, out.dtype)
    for name, got, exp, x in zip(("da", "db"), vjp(cot), ref_vjp(cot), (a, b), strict=True):
        assert got.dtype == x.dtype, name
        assert_close(got, exp, dtype, what=name)


@needs_kernels
def test_public_op_conformance() -> None:
    assert check_op("matmul", "triton") == 2 * len(MATMUL_SHAPES)


@needs_kernels
def test_float16_with_float32_output_and_fast_precision() -> None:
    shapes = (((9, 20), (20, 7)), ((2, 3, 5), (5, 4)))
    assert check_matmul("triton", dtypes=(jnp.float16,), preferred_element_type=jnp.float32, precision="default",
                        shapes=shapes) == 2


@needs_kernels
@pytest.mark.parametrize(("sa", "sb", "dtype"), [
    ((37, 45), (45, 29), "float32"),  # no dim a multiple of the 16-wide tiles
    ((3, 33, 20), (20, 18), "bfloat16"),  # a's batch folds into its rows
    ((17, 24), (3, 24, 40), "float16"),  # only b batched: d a sums the batch inside the kernel
    ((2, 1, 20, 17), (3, 17, 21), "float32"),  # both batched, broadcast: partial gradients summed
], ids=str)
def test_ragged_shapes_over_several_tiles(sa: tuple[int, ...], sb: tuple[int, ...], dtype: str) -> None:
    rng = np.random.default_rng(1)
    check_against_reference(_normal(rng, sa, dtype), _normal(rng, sb, dtype))


@needs_kernels
@pytest.mark.parametrize(("sa", "sb"), [
    ((37, 45), (45, 29)),  # 6 tiles over 3 interpreted programs (one per SM on a GPU)
    ((2, 1, 20, 17), (3, 17, 21)),  # batched tiles; the gradients sum a batch inside the kernel
], ids=str)
def test_persistent_programs_walk_every_tile(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    rng = np.random.default_rng(6)
    cfg = attrs.evolve(SMALL, persistent=True)
    a, b = _normal(rng, sa, jnp.float32), _normal(rng, sb, jnp.float32)
    args = kernel_args(batch=1, red=1, m=37, n=29, k=45, a=(0, 0, 45, 1), b=(0, 0, 29, 1), dtype=jnp.float32,
                       out_dtype=jnp.float32, precision="highest", cfg=cfg)
    assert args["TILES"] == 6 and args["grid"] == (args["PROGRAMS"],) == ((6,) if ON_GPU else (3,))
    check_against_reference(a, b, cfg=cfg)


@needs_kernels
@pytest.mark.parametrize(("sa", "sb", "split", "dtype"), [
    ((1, 200), (200, 48), 2, "float32"),
    ((3, 1000), (1000, 300), 4, "bfloat16"),
    ((16, 200), (200, 48), 8, "float32"),  # 13 steps of 16 in splits of 2: the last split is empty
    ((2, 3, 1000), (1000, 48), 8, "bfloat16"),  # a's batch folded into its rows
    ((3, 200), (2, 200, 300), 4, "float32"),  # only b batched: partials of two batches
], ids=str)
def test_split_k_matches_reference(sa: tuple[int, ...], sb: tuple[int, ...], split: int, dtype: str) -> None:
    rng = np.random.default_rng(7)
    check_against_reference(_normal(rng, sa, dtype), _normal(rng, sb, dtype), cfg=attrs.evolve(SMALL, split_k=split))


def test_split_k_launch_layout() -> None:
    def args(k: int, split_k: int, m: int = 16, n: int = 48, batch: int = 1) -> dict[str, Any]:
        return kernel_args(batch=batch, red=1, m=m, n=n, k=k, a=(0, 0, k, 1), b=(0, 0, n, 1), dtype=jnp.bfloat16,
                           out_dtype=jnp.bfloat16, precision="highest", cfg=attrs.evolve(SMALL, split_k=split_k))

    plain = args(200, 1)
    assert plain["grid"] == (3,) and plain["SPLIT_K"] == 1 and plain["out_shapes"][0].dtype == jnp.bfloat16
    split = args(200, 8, batch=2)
    assert split["grid"] == (6, 8) and split["SPLIT_K"] == 8
    assert (split["out_shapes"][0].shape, split["out_shapes"][0].dtype) == ((8, 2, 16, 48), jnp.float32)
    assert 7 * cdiv(cdiv(200, 8), 16) * 16 >= 200  # the case above whose last split is empty
    assert args(40, 16)["SPLIT_K"] == 3  # no more splits than contraction steps


@needs_kernels
def test_split_k_sums_a_batch_inside_the_kernel() -> None:
    # The RED axis with split-K (the gradients run unsplit, so this is the kernel's own check).
    rng = np.random.default_rng(8)
    x, y = _normal(rng, (3, 5, 70), jnp.float32), _normal(rng, (3, 70, 20), jnp.float32)
    out = _matmul._product(_matmul._matrix(x, summed=True), _matmul._matrix(y, summed=True), batch=1, red=3, m=5,
                           n=20, k=70, out_dtype=jnp.float32, precision="highest",
                           cfg=attrs.evolve(SMALL, split_k=4))
    assert_close(out[0], jnp.einsum("rmk,rkn->mn", x, y, precision="highest"), jnp.float32)


@needs_kernels
def test_empty_and_mixed_dtypes() -> None:
    rng = np.random.default_rng(2)
    a, b = _normal(rng, (5, 0), jnp.float32), _normal(rng, (0, 3), jnp.float32)
    out = ejk.matmul(a, b, platform="triton")
    assert out.shape == (5, 3) and not np.asarray(out).any()
    assert ejk.matmul(jnp.ones((0, 4)), jnp.ones((4, 3)), platform="triton").shape == (0, 3)
    # bfloat16 @ float32: computed in float32 (their common dtype), gradients in each operand's dtype.
    check_against_reference(_normal(rng, (12, 20), jnp.bfloat16), _normal(rng, (20, 6), jnp.float32),
                            tol_dtype=jnp.bfloat16)


@needs_kernels
def test_jit_vmap_grad_compose() -> None:
    rng = np.random.default_rng(3)
    a, b = _normal(rng, (3, 10, 8), jnp.float32), _normal(rng, (8, 6), jnp.float32)

    def loss(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.sum(jax.vmap(lambda x: ejk.matmul(x, b, platform="triton", cfg=SMALL))(a) ** 2)

    def ref(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.sum(reference_matmul(a, b) ** 2)

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(a, b)
    want = jax.grad(ref, argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, jnp.float32)


def test_precision_maps_to_tl_dot() -> None:
    assert _dots.dot_precision(jnp.float32, ("highest", "highest")) == "ieee"
    assert _dots.dot_precision(jnp.float32, ("default", "high")) == "tf32x3"  # the higher of the pair
    assert _dots.dot_precision(jnp.float32, "default") == "tf32"
    assert _dots.dot_precision(jnp.bfloat16, ("highest", "highest")) == "tf32"  # 16-bit products are exact


def _sds(shape: tuple[int, ...], dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def test_capability_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    assert capability(_sds((7,)), _sds((3, 7, 5))) is None
    assert capability(_sds((5, 3), jnp.float16), _sds((3, 2), jnp.float32), precision=("highest", "highest")) is None
    reason = capability(_sds((4, 4), jnp.float64), _sds((4, 4), jnp.float64))
    assert reason is not None and "float64" in reason
    reason = capability(_sds((2**15, 2**15)), _sds((2**15, 8)))
    assert reason is not None and "int32" in reason
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "0")
    if not ON_GPU:
        reason = capability(_sds((4, 4)), _sds((4, 4)))
        assert reason is not None and "NVIDIA GPU" in reason


@pytest.mark.parametrize(("field", "bad"), [("block_m", 48), ("block_k", 8), ("group_m", 0), ("num_warps", 3),
                                            ("num_stages", 0), ("block_n", True), ("split_k", 3),
                                            ("split_k", 32)])
def test_config_validation(field: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=f"MatmulConfig.{field}"):
        MatmulConfig(**{field: bad})


def test_split_k_needs_one_program_per_tile() -> None:
    with pytest.raises(ValueError, match=r"MatmulConfig\.split_k is 2 but persistent=True"):
        MatmulConfig(split_k=2, persistent=True)


def test_configs_serialized_without_split_k_load_unsplit() -> None:
    cfg = MatmulConfig(block_m=64, block_n=64, num_stages=4)
    old = {k: v for k, v in to_jsonable(cfg).items() if k != "split_k"}
    assert from_jsonable(old, cfg_type=MatmulConfig) == cfg and cfg.split_k == 1
    split = attrs.evolve(cfg, split_k=4)
    assert from_jsonable(json.loads(json.dumps(to_jsonable(split))), cfg_type=MatmulConfig) == split


def test_gpu_configs_by_shape_and_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)  # the GPU tables, whatever this machine is
    big = (_sds((8192, 8192)), _sds((8192, 8192)))
    cfg = heuristic_config(*big)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages) == (128, 256, 64, 8, 3)
    assert cfg.persistent
    assert heuristic_config(_sds((8, 4096)), _sds((4096, 4096))).block_m == 16  # small m: short tiles
    mid = heuristic_config(_sds((1024, 1024)), _sds((1024, 1024)))
    assert (1024 // mid.block_m) * (1024 // mid.block_n) >= _device.sm_count()  # no idle SM
    space = config_space(*big)
    assert space[0] == cfg and len(space) == len(set(space)) > 4
    f32 = config_space(_sds((512, 512), jnp.float32), _sds((512, 512), jnp.float32))
    for limit_kib in (99, 163, 227):
        monkeypatch.setattr(_device, "smem_limit", lambda limit_kib=limit_kib: limit_kib * 1024)
        for c in config_space(*big) + f32:
            itemsize = 4 if c in f32 else 2
            need = _dots.smem_bytes(c.block_m, c.block_n, c.block_k, c.num_stages, itemsize, flattened=c.persistent)
            assert need <= limit_kib * 1024


def test_split_k_for_decode_shapes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)
    monkeypatch.setattr(_device, "sm_count", lambda: 132)
    decode = (_sds((1, 14336)), _sds((14336, 4096)))
    cfg = heuristic_config(*decode)
    assert (cfg.block_m, cfg.persistent) == (16, False) and cfg.split_k > 1
    tiles = cdiv(4096, cfg.block_n)
    assert 4 * tiles * cfg.split_k >= 3 * 132 and 14336 // cfg.split_k >= 512
    assert heuristic_config(_sds((4, 1, 14336)), _sds((14336, 4096))).split_k == cfg.split_k  # rows folded
    space = config_space(*decode)
    assert space[0] == cfg and {c.split_k for c in space} == {1, 2, 4, 8, 16}
    square = (_sds((4096, 4096)), _sds((4096, 4096)))
    assert heuristic_config(*square).split_k == 1 and {c.split_k for c in config_space(*square)} == {1}
    assert heuristic_config(_sds((128, 4096)), _sds((4096, 14336))).split_k == 1  # enough tiles
    assert heuristic_config(_sds((64, 4096)), _sds((4096, 4096))).split_k == 1  # partials as big as a split's work
    monkeypatch.setattr(_device, "sm_count", lambda: 16)
    assert heuristic_config(*decode).split_k == 1  # a small GPU: the tiles fill it


_AOT_SPLIT_K = """
import json
from ejk_triton import _aot, _matmul
report = {split: _aot.compile_matmul(1, 4096, 14336, cfg=_matmul.MatmulConfig(
    block_m=16, block_n=64, block_k=128, num_stages=4, split_k=split)) for split in (1, 4)}
print(json.dumps(report))
"""


def test_split_k_compiles_for_sm90_without_a_gpu(compile_report: Any) -> None:
    report = compile_report(_AOT_SPLIT_K)
    # The split contraction loop (runtime trip count, float32 partials) keeps the unsplit loop's software
    # pipeline; the gradients never split.
    assert report["4"] == report["1"] and report["4"]["forward"]["shared"] >= _dots.smem_bytes(16, 64, 128, 2, 2)


def test_priority_keeps_xla_dot_first() -> None:
    (spec,) = [s for s in ejk.kernel_registry.list_implementations("matmul")
               if s.platform == "triton" and str(s.backend) == "gpu"]
    assert spec.priority < 0 and spec.name == "gemm" and spec.cfg_type is MatmulConfig and spec.vjp is not None


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("sa", "sb", "dtype"), [
    ((2048, 4096), (4096, 1024), "bfloat16"),
    ((4096, 512), (512, 4096), "bfloat16"),  # 512 tiles: the heuristic's persistent programs walk them
    ((3, 1000, 777), (777, 1001), "float16"),
    ((4, 513, 256), (4, 256, 300), "bfloat16"),
    ((8, 1024), (4, 1024, 512), "float32"),
    ((1, 14336), (14336, 4096), "bfloat16"),  # decode shapes: the heuristic splits the contraction
    ((32, 14336), (14336, 4096), "bfloat16"),
    ((5, 3000), (3000, 700), "float16"),
], ids=str)
def test_gpu_matches_reference(sa: tuple[int, ...], sb: tuple[int, ...], dtype: str) -> None:
    rng = np.random.default_rng(0)
    check_against_reference(_normal(rng, sa, dtype), _normal(rng, sb, dtype), cfg=None)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_config_space_and_conformance() -> None:
    rng = np.random.default_rng(1)
    a, b = _normal(rng, (1024, 768), jnp.bfloat16), _normal(rng, (768, 640), jnp.bfloat16)
    want = reference_matmul(a, b)
    for cfg in config_space(a, b):
        assert_close(jax.jit(lambda a, b, cfg=cfg: ejk.matmul(a, b, platform="triton", cfg=cfg))(a, b), want,
                     jnp.bfloat16, what=str(cfg))
    assert check_op("matmul", "triton", dtypes=(jnp.float32, jnp.bfloat16, jnp.float16)) == 3 * len(MATMUL_SHAPES)
