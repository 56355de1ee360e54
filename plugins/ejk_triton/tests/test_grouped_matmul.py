"""The Triton grouped matmul against the per-row reference: groups, gradients, dtypes, gates, configs, AOT.

On a CPU the kernels run through Triton's interpreter (``EJK_TRITON_INTERPRET=1``, see conftest.py);
tests marked ``gpu`` run MoE-sized shapes compiled on an NVIDIA GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_op, reference_grouped_matmul
from ejk_triton import _device, _dots, _env, _grouped_matmul
from ejk_triton._grouped_matmul import GroupedMatmulConfig, capability, config_space, heuristic_config

ON_GPU = _env.nvidia_gpu()[0]
# Each case compiles the kernel's and the reference's programs: cheap XLA CPU optimisation keeps the file fast.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")
#: Small tiles: several row tiles per group and several column tiles (3 persistent programs in the interpreter).
SMALL = GroupedMatmulConfig(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=2)


def vjp_of(fn: Any, *args: jax.Array) -> tuple[jax.Array, Any]:
    """``jax.vjp`` of ``fn`` with the output and the pullback each one jitted program."""
    out = jax.jit(fn, compiler_options=None if ON_GPU else FAST_COMPILE)(*args)
    pullback = jax.jit(lambda cot: jax.vjp(fn, *args)[1](cot), compiler_options=None if ON_GPU else FAST_COMPILE)
    return out, pullback


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)


def check_against_reference(m: int, k: int, n: int, sizes: list[int], dtype: Any, *, cfg: Any = SMALL,
                            seed: int = 0, **options: Any) -> jax.Array:
    """Output and gradients of ``ejk.grouped_matmul(platform="triton")`` against the reference; returns the output."""
    rng = np.random.default_rng(seed)
    lhs, rhs = _normal(rng, (m, k), dtype), _normal(rng, (len(sizes), k, n), dtype)
    group_sizes = jnp.asarray(sizes, jnp.int32)

    def ours(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
        return ejk.grouped_matmul(lhs, rhs, group_sizes, platform="triton", cfg=cfg, **options)

    def ref(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
        return reference_grouped_matmul(lhs, rhs, group_sizes, **options)

    out, vjp = vjp_of(ours, lhs, rhs)
    want, ref_vjp = vjp_of(ref, lhs, rhs)
    assert (out.shape, out.dtype) == (want.shape, want.dtype)
    assert_close(out, want, dtype)
    cot = _normal(rng, out.shape, out.dtype)
    for name, got, exp, x in zip(("d lhs", "d rhs"), vjp(cot), ref_vjp(cot), (lhs, rhs), strict=True):
        assert got.dtype == x.dtype, name
        assert_close(got, exp, dtype, what=name)
    return out


@needs_kernels
def test_public_op_conformance() -> None:
    assert check_op("grouped_matmul", "triton") == 10
    assert check_op("grouped_matmul", "triton", activation="swiglu") == 10


@needs_kernels
def test_float16_with_float32_output_and_fast_precision() -> None:
    out = check_against_reference(50, 20, 24, [5, 0, 30], jnp.float16, preferred_element_type=jnp.float32,
                                  precision="default")
    assert out.dtype == jnp.float32


@needs_kernels
@pytest.mark.parametrize(("m", "k", "n", "sizes", "dtype"), [
    (64, 32, 48, [16, 16, 16, 16], "bfloat16"),  # equal groups, one row tile each
    (100, 24, 40, [0, 61, 3, 0, 20], "float32"),  # skewed and empty groups, 16 rows past the sum, k % 16 != 0
    (45, 16, 20, [0, 0, 45], "float16"),  # every row in the last group; m % 16 != 0
], ids=str)
def test_groups_over_several_tiles(m: int, k: int, n: int, sizes: list[int], dtype: str) -> None:
    check_against_reference(m, k, n, sizes, dtype)


@needs_kernels
@pytest.mark.parametrize(("m", "k", "n", "sizes", "dtype"), [
    (64, 32, 64, [16, 16, 16, 16], "bfloat16"),  # equal groups; two output column tiles
    (100, 24, 2 * 21, [0, 61, 3, 0, 20], "float32"),  # skewed, empty, 16 rows past the sum; n / 2 % 16 != 0
    (45, 16, 2 * 10, [0, 0, 45], "float16"),  # every row in the last group; narrower than a tile
], ids=str)
def test_swiglu_in_the_epilogue_matches_the_reference(m: int, k: int, n: int, sizes: list[int], dtype: str) -> None:
    out = check_against_reference(m, k, n, sizes, dtype, activation="swiglu")
    assert out.shape == (m, n // 2)


@needs_kernels
def test_swiglu_walking_the_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_grouped_matmul, "FLAT_GROUPS", 2)  # a fresh trace: shapes of no other test
    check_against_reference(103, 24, 2 * 18, [0, 61, 3, 0, 20], "float32", activation="swiglu")


def test_swiglu_configs_hold_two_products_a_tile() -> None:
    lhs, rhs = jax.ShapeDtypeStruct((16384, 4096), jnp.bfloat16), jax.ShapeDtypeStruct((8, 4096, 28672), jnp.bfloat16)
    args = _grouped_matmul.product_args(m=16384, n=28672, k=4096, groups=8, transpose_w=False, dtype=jnp.bfloat16,
                                        out_dtype=jnp.bfloat16, precision="highest", cfg=SMALL, gated=True)
    assert args["GATED"] and args["out_shapes"][0].shape == (16384, 14336)
    plain, gated = _grouped_matmul._fitting(lhs, rhs), _grouped_matmul._fitting(lhs, rhs, gated=True)
    assert max(c.block_n for c in plain) == 256 and gated and all(c.block_n <= 128 for c in gated)


@needs_kernels
def test_walking_the_groups_matches_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past FLAT_GROUPS groups the forward kernel walks the groups instead of holding the work list
    # in registers; values and gradients (d lhs runs the same kernel) match the reference. Shapes
    # no other test uses, so no trace of the other path is reused.
    assert _grouped_matmul.product_args(m=101, n=40, k=24, groups=5, transpose_w=False, dtype=jnp.float32,
                                        out_dtype=jnp.float32, precision="highest", cfg=SMALL)["G_FLAT"] == 16
    monkeypatch.setattr(_grouped_matmul, "FLAT_GROUPS", 4)
    assert _grouped_matmul.product_args(m=101, n=40, k=24, groups=5, transpose_w=False, dtype=jnp.float32,
                                        out_dtype=jnp.float32, precision="highest", cfg=SMALL)["G_FLAT"] == 0
    check_against_reference(101, 24, 40, [0, 61, 3, 0, 20], "float32")


@needs_kernels
def test_rows_past_the_sum_are_zero_and_never_read() -> None:
    rng = np.random.default_rng(4)
    lhs = _normal(rng, (40, 16), jnp.float32).at[30:].set(jnp.nan)  # rows in no group
    rhs = _normal(rng, (2, 16, 8), jnp.float32)
    sizes = jnp.asarray([12, 18], jnp.int32)
    out, vjp = jax.vjp(lambda lhs, rhs: ejk.grouped_matmul(lhs, rhs, sizes, platform="triton", cfg=SMALL), lhs, rhs)
    assert not np.asarray(out[30:]).any() and np.isfinite(np.asarray(out[:30])).all()
    d_lhs, d_rhs = vjp(jnp.ones_like(out))
    assert np.isfinite(np.asarray(d_rhs)).all() and not np.asarray(d_lhs[30:]).any()
    assert_close(d_rhs, jax.grad(lambda r: jnp.sum(reference_grouped_matmul(lhs[:30], r, sizes)))(rhs), jnp.float32)


@needs_kernels
def test_tiny_and_empty_contractions() -> None:
    check_against_reference(9, 1, 3, [4, 0, 5], jnp.float32)  # k = 1
    out = ejk.grouped_matmul(jnp.ones((6, 0)), jnp.ones((2, 0, 5)), jnp.asarray([2, 3]), platform="triton")
    assert out.shape == (6, 5) and not np.asarray(out).any()
    d_rhs = jax.grad(lambda r: jnp.sum(ejk.grouped_matmul(jnp.ones((6, 4)), r, jnp.asarray([0, 3]),
                                                          platform="triton")))(jnp.ones((2, 4, 5)))
    assert not np.asarray(d_rhs[0]).any()  # an empty group's gradient is zeros
    assert_close(d_rhs[1], jnp.full((4, 5), 3.0), jnp.float32)


@needs_kernels
def test_jit_traced_sizes_and_vmap() -> None:
    rng = np.random.default_rng(6)
    lhs, rhs = _normal(rng, (2, 20, 8), jnp.float32), _normal(rng, (3, 8, 4), jnp.float32)
    sizes = jnp.asarray([[5, 0, 9], [20, 0, 0]], jnp.int32)

    @jax.jit
    def run(lhs: jax.Array, sizes: jax.Array) -> jax.Array:
        return jax.vmap(lambda x, s: ejk.grouped_matmul(x, rhs, s, platform="triton", cfg=SMALL))(lhs, sizes)

    want = jnp.stack([reference_grouped_matmul(lhs[i], rhs, sizes[i]) for i in range(2)])
    assert_close(run(lhs, sizes), want, jnp.float32)


_SHARD_MAP_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import ejk
from ejk.testing import reference_grouped_matmul
shard_map = getattr(jax, "shard_map", None)
if shard_map is None:
    from jax.experimental.shard_map import shard_map
mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
keys = jax.random.split(jax.random.key(0), 2)
a, b = jax.random.normal(keys[0], (4, 8, 16)), jax.random.normal(keys[1], (16, 8))
mm = jax.jit(shard_map(lambda a, b: ejk.matmul(a, b, platform="triton"), mesh=mesh, in_specs=(P("x"), P()),
                       out_specs=P("x")))
np.testing.assert_allclose(mm(a, b), a @ b, atol=1e-4, rtol=1e-4)
grads = jax.jit(jax.grad(lambda a, b: mm(a, b).sum(), argnums=(0, 1)))(a, b)  # b replicated: summed over shards
want = jax.grad(lambda a, b: (a @ b).sum(), argnums=(0, 1))(a, b)
for g, w in zip(grads, want):
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
lhs, rhs = jax.random.normal(keys[0], (12, 16)), jax.random.normal(keys[1], (3, 16, 8))
sizes = jnp.array([4, 0, 6], jnp.int32)
gmm = jax.jit(shard_map(lambda l, r, s: ejk.grouped_matmul(l, r, s, platform="triton"), mesh=mesh,
                        in_specs=(P(), P(None, None, "x"), P()), out_specs=P(None, "x")))
np.testing.assert_allclose(gmm(lhs, rhs, sizes), reference_grouped_matmul(lhs, rhs, sizes), atol=1e-4, rtol=1e-4)
grads = jax.jit(jax.grad(lambda l, r: gmm(l, r, sizes).sum(), argnums=(0, 1)))(lhs, rhs)
want = jax.grad(lambda l, r: reference_grouped_matmul(l, r, sizes).sum(), argnums=(0, 1))(lhs, rhs)
for g, w in zip(grads, want):
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
print("ok")
"""


@pytest.mark.skipif(not _env.interpret_mode(), reason="the two-device run uses the interpreter on the CPU")
def test_shard_map_with_sharded_and_replicated_operands() -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    result = subprocess.run([sys.executable, "-c", _SHARD_MAP_SCRIPT], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def _sds(shape: tuple[int, ...], dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def test_capability_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    gs = _sds((8,), jnp.int32)
    assert capability(_sds((100, 64)), _sds((8, 64, 32)), gs) is None
    assert capability(_sds((100, 64), jnp.float32), _sds((8, 64, 32), jnp.float16), gs,
                      preferred_element_type=np.dtype(jnp.bfloat16)) is None
    reason = capability(_sds((100, 64)), _sds((8, 64, 32)), _sds((8,), jnp.float32))
    assert reason is not None and "group_sizes" in reason
    reason = capability(_sds((2**16, 2**14)), _sds((8, 2**14, 32)), gs)
    assert reason is not None and "int32" in reason
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "0")
    if not ON_GPU:
        reason = capability(_sds((4, 4)), _sds((1, 4, 4)), _sds((1,), jnp.int32))
        assert reason is not None and "NVIDIA GPU" in reason


@pytest.mark.parametrize(("field", "bad"), [("block_m", 24), ("block_n", 8), ("num_warps", 5),
                                            ("programs_per_sm", 0)])
def test_config_validation(field: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=f"GroupedMatmulConfig.{field}"):
        GroupedMatmulConfig(**{field: bad})


def test_gpu_configs_by_shape_and_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)  # the GPU tables, whatever this machine is
    moe = (_sds((32768, 2048)), _sds((64, 2048, 1536)), _sds((64,), jnp.int32))
    cfg = heuristic_config(*moe)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages) == (128, 256, 64, 8, 4)
    assert heuristic_config(_sds((512, 2048)), _sds((64, 2048, 1536)), moe[2]).block_m == 64  # 8 rows a group
    space = config_space(*moe)
    assert space[0] == cfg and len(space) == len(set(space)) > 4
    for limit_kib in (99, 163, 227):
        monkeypatch.setattr(_device, "smem_limit", lambda limit_kib=limit_kib: limit_kib * 1024)
        for c in config_space(*moe):
            need = _dots.smem_bytes(c.block_m, c.block_n, c.block_k, c.num_stages, 2, flattened=True)
            assert need <= limit_kib * 1024


def test_priority_prefers_triton_over_the_xla_scan() -> None:
    (spec,) = [s for s in ejk.kernel_registry.list_implementations("grouped_matmul")
               if s.platform == "triton" and str(s.backend) == "gpu"]
    assert spec.priority > 0 and spec.name == "persistent" and spec.vjp is not None


_AOT_SCRIPT = """
import json, jax.numpy as jnp
from ejk_triton._aot import compile_grouped_matmul, compile_matmul
report = {"matmul 8192": compile_matmul(8192, 8192, 8192), "matmul odd f16": compile_matmul(40, 1000, 333, jnp.float16),
          "moe": compile_grouped_matmul(32768, 2048, 1536, 64),
          "moe many groups": compile_grouped_matmul(32768, 256, 256, 2048),
          "moe f32 tf32": compile_grouped_matmul(1000, 100, 72, 8, jnp.float32, precision="default"),
          "moe swiglu": compile_grouped_matmul(16384, 4096, 2 * 14336, 8, activation="swiglu")}
print(json.dumps(report))
"""


def test_kernels_compile_for_sm90_without_a_gpu(compile_report: Any) -> None:
    # Compiles the matmul and grouped matmul launches (forward and both gradients) as a GPU would,
    # in a process without the interpreter (the grouped forward with its work list in registers, and
    # walking 2048 groups); the Hopper tiles must be software-pipelined (3 or 4 stages of 128x64 and
    # 64x256 bf16 tiles in shared memory, what the estimate in _dots counts), the flattened
    # (persistent) loops staging their epilogue on top of that.
    report = compile_report(_AOT_SCRIPT)
    for variant, launches in report.items():
        for name, info in launches.items():
            assert 0 < info["shared"] <= 227 * 1024, f"{variant} {name}: {info}"
    def ring(stages: int, flattened: bool = False) -> int:
        return _dots.smem_bytes(128, 256, 64, stages, 2, flattened=flattened)

    assert {info["shared"] for info in report["matmul 8192"].values()} == {ring(3, flattened=True)}
    moe = report["moe"]
    assert moe["forward"]["shared"] == moe["d_lhs"]["shared"] == ring(4, flattened=True)
    assert moe["d_rhs"]["shared"] == ring(4)
    # The gated forward: 128-wide gate and up tiles a stage (256 columns of rhs), as the plain 128x256 ring.
    assert report["moe swiglu"]["forward"]["shared"] == ring(4, flattened=True)


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("m", "k", "n", "sizes", "dtype"), [
    (4096, 1024, 768, [512] * 8, "bfloat16"),
    (3000, 512, 1000, [0, 1500, 7, 0, 1, 1300, 0, 0], "bfloat16"),  # skewed, empty, 192 rows past the sum
    (1000, 200, 300, [100, 0, 400, 333], "float16"),
    (777, 256, 128, [200, 300, 277], "float32"),
], ids=str)
def test_gpu_matches_reference(m: int, k: int, n: int, sizes: list[int], dtype: str) -> None:
    check_against_reference(m, k, n, sizes, dtype, cfg=None)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("m", "k", "n", "sizes", "dtype"), [
    (4096, 1024, 2 * 768, [512] * 8, "bfloat16"),
    (3000, 512, 2 * 500, [0, 1500, 7, 0, 1, 1300, 0, 0], "bfloat16"),  # n / 2 not a multiple of the tile
    (777, 256, 2 * 128, [200, 300, 277], "float32"),
], ids=str)
def test_gpu_swiglu_matches_reference(m: int, k: int, n: int, sizes: list[int], dtype: str) -> None:
    check_against_reference(m, k, n, sizes, dtype, cfg=None, activation="swiglu")


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_walking_the_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_grouped_matmul, "FLAT_GROUPS", 0)  # shapes of no other test: a fresh trace
    check_against_reference(3001, 512, 1000, [0, 1500, 7, 0, 1, 1300, 0, 0], "bfloat16", cfg=None)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_config_space_and_conformance() -> None:
    sizes = [300, 0, 700, 24, 0, 1000]
    for cfg in config_space(_sds((2048, 512)), _sds((6, 512, 384)), _sds((6,), jnp.int32)):
        check_against_reference(2048, 512, 384, sizes, jnp.bfloat16, cfg=cfg)
    assert check_op("grouped_matmul", "triton", dtypes=(jnp.float32, jnp.bfloat16, jnp.float16)) == 15
