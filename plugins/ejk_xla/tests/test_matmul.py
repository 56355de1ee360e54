"""The XLA matmul against the float32 reference, its config, and ``check_matmul_args``."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk.ops._check_grouped import check_matmul_args
from ejk.testing import reference_matmul
from ejk_xla._matmul import MatmulConfig, config_space, heuristic_config, matmul

pytestmark = pytest.mark.filterwarnings("error")

# Relative to the largest reference magnitude: products are exact in float32, the rest is
# the output rounding of each dtype (plus summation order).
TOLERANCE = {jnp.float32: 1e-5, jnp.float16: 2e-3, jnp.bfloat16: 1.6e-2}
DTYPES = pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=["f32", "f16", "bf16"])


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), dtype)


def _assert_close(out: jax.Array, ref: jax.Array, tol: float) -> None:
    assert out.shape == ref.shape
    assert out.dtype == ref.dtype
    out32, ref32 = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    scale = max(1.0, float(np.abs(ref32).max(initial=0.0)))
    np.testing.assert_allclose(out32, ref32, rtol=tol, atol=tol * scale)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@DTYPES
@pytest.mark.parametrize(
    ("a_shape", "n"),
    [((1, 1), 1), ((7, 13), 5), ((64, 48), 40), ((3, 17, 9), 11), ((2, 3, 5, 33), 6)],
    ids=["1x1", "7x13", "64x48", "batch1", "batch2"],
)
def test_matches_reference(rng: np.random.Generator, dtype: jnp.dtype, a_shape: tuple[int, ...], n: int) -> None:
    a = _random(rng, a_shape, dtype)
    b = _random(rng, (a_shape[-1], n), dtype)
    out = matmul(a, b)
    assert out.shape == (*a_shape[:-1], n)
    _assert_close(out, reference_matmul(a, b), TOLERANCE[dtype])


def test_random_shapes(rng: np.random.Generator) -> None:
    for _ in range(6):
        batch = tuple(rng.integers(1, 4, size=rng.integers(0, 3)))
        m, k, n = (int(x) for x in rng.integers(1, 70, size=3))
        a, b = _random(rng, (*batch, m, k), jnp.float32), _random(rng, (k, n), jnp.float32)
        _assert_close(matmul(a, b), reference_matmul(a, b), TOLERANCE[jnp.float32])


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype", "out_dtype"),
    [(jnp.bfloat16, jnp.float32, jnp.float32), (jnp.float16, jnp.bfloat16, jnp.float32),
     (jnp.float16, jnp.float32, jnp.float32)],
)
def test_mixed_dtypes_promote(rng: np.random.Generator, a_dtype: jnp.dtype, b_dtype: jnp.dtype,
                              out_dtype: jnp.dtype) -> None:
    a, b = _random(rng, (9, 12), a_dtype), _random(rng, (12, 4), b_dtype)
    out = matmul(a, b)
    assert out.dtype == out_dtype
    _assert_close(out, reference_matmul(a, b), TOLERANCE[jnp.float32])


def test_accumulates_in_float32(rng: np.random.Generator) -> None:
    """Long bf16 sums keep float32 accuracy until the single final rounding."""
    k = 4096
    a = jnp.ones((2, k), jnp.bfloat16)
    b = jnp.asarray(rng.uniform(0.5, 1.5, size=(k, 3)), jnp.bfloat16)
    exact = np.asarray(b, np.float64).sum(axis=0)
    out = np.asarray(matmul(a, b), np.float64)
    np.testing.assert_allclose(out, np.broadcast_to(exact, out.shape), rtol=2**-8)


def test_jit_and_vmap(rng: np.random.Generator) -> None:
    a, b = _random(rng, (4, 6, 10), jnp.float32), _random(rng, (3, 10, 5), jnp.float32)
    jitted = jax.jit(matmul)
    _assert_close(jitted(a[0], b[0]), reference_matmul(a[0], b[0]), 1e-5)
    batched = jax.vmap(matmul, in_axes=(None, 0))(a, b)  # a [4,6,10] against each b[i]
    expected = jnp.stack([reference_matmul(a, b[i]) for i in range(3)])
    _assert_close(batched, expected, 1e-5)
    over_a = jax.jit(jax.vmap(matmul, in_axes=(0, None)))(a, b[0])
    _assert_close(over_a, reference_matmul(a, b[0]), 1e-5)


def test_gradients_match_reference(rng: np.random.Generator) -> None:
    a, b = _random(rng, (2, 7, 9), jnp.float32), _random(rng, (9, 4), jnp.float32)
    cot = _random(rng, (2, 7, 4), jnp.float32)

    def loss(fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[[jax.Array, jax.Array], jax.Array]:
        return lambda x, y: jnp.sum(fn(x, y) * cot)

    got = jax.grad(loss(matmul), argnums=(0, 1))(a, b)
    want = jax.grad(loss(reference_matmul), argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, 1e-5)


def test_precision_knob(rng: np.random.Generator) -> None:
    a, b = _random(rng, (5, 8), jnp.float32), _random(rng, (8, 3), jnp.float32)
    for precision in ("default", "high", "highest"):
        out = matmul(a, b, cfg=MatmulConfig(precision=precision))
        _assert_close(out, reference_matmul(a, b), 1e-2)  # "default" may use TF32 on a GPU


def test_config_validation_and_space() -> None:
    with pytest.raises(ValueError, match="precision"):
        MatmulConfig(precision="fastest")
    with pytest.raises(TypeError):
        MatmulConfig("highest")  # type: ignore[misc]  # keyword-only
    cfg = MatmulConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.precision = "default"  # type: ignore[misc]
    a, b = jax.ShapeDtypeStruct((4, 8, 16), jnp.bfloat16), jax.ShapeDtypeStruct((16, 2), jnp.bfloat16)
    assert config_space(a, b) == [MatmulConfig()]
    assert heuristic_config(a, b) == MatmulConfig()
    assert hash(heuristic_config(a, b)) == hash(MatmulConfig())


# -- check_matmul_args ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (jax.ShapeDtypeStruct((5,), jnp.float32), jax.ShapeDtypeStruct((5, 2), jnp.float32),
         r"matmul: a has shape \(5,\) but needs \[\.\.\., m, k\]"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), jax.ShapeDtypeStruct((5,), jnp.float32),
         r"matmul: b has shape \(5,\) but needs \[k=5, n\]"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), jax.ShapeDtypeStruct((2, 5, 3), jnp.float32),
         r"matmul: b has shape \(2, 5, 3\)"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), jax.ShapeDtypeStruct((6, 3), jnp.float32),
         r"matmul: b has shape \(6, 3\) but needs \[k=5, n\]"),
        (jax.ShapeDtypeStruct((4, 5), jnp.int32), jax.ShapeDtypeStruct((5, 3), jnp.float32),
         r"matmul: a has dtype int32 but needs a floating dtype"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), jax.ShapeDtypeStruct((5, 3), jnp.bool_),
         r"matmul: b has dtype bool"),
        (None, jax.ShapeDtypeStruct((5, 3), jnp.float32), r"matmul: a is None"),
    ],
    ids=["a_1d", "b_1d", "b_3d", "k_mismatch", "a_int", "b_bool", "a_none"],
)
def test_check_errors(a: object, b: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_matmul_args(a, b)


def test_check_accepts_valid_and_traced() -> None:
    a, b = jnp.ones((2, 3, 4), jnp.bfloat16), jnp.ones((4, 5), jnp.float32)
    check_matmul_args(a, b)
    check_matmul_args(jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(b.shape, b.dtype))
    jax.jit(lambda x, y: check_matmul_args(x, y))(a, b)
