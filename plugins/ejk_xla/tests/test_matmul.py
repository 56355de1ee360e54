"""The XLA matmul against the float32 reference, its config, and ``check_matmul_args``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.ops.validate import check_matmul_args
from ejk.testing import assert_close, jaxpr_equations, reference_matmul
from ejk_xla._matmul import MatmulConfig, config_space, heuristic_config, matmul

pytestmark = pytest.mark.filterwarnings("error")

#: ejk.testing's comparison with the matmul rows of its tolerance table, shapes and dtypes included.
close = functools.partial(assert_close, kind="matmul", strict=True)

DTYPES = pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=["f32", "f16", "bf16"])


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), dtype)


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
    close(out, reference_matmul(a, b), dtype)


def test_random_shapes(rng: np.random.Generator) -> None:
    for _ in range(6):
        batch = tuple(rng.integers(1, 4, size=rng.integers(0, 3)))
        m, k, n = (int(x) for x in rng.integers(1, 70, size=3))
        a, b = _random(rng, (*batch, m, k), jnp.float32), _random(rng, (k, n), jnp.float32)
        close(matmul(a, b), reference_matmul(a, b), jnp.float32)


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
    close(out, reference_matmul(a, b), jnp.float32)


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
    close(jitted(a[0], b[0]), reference_matmul(a[0], b[0]), jnp.float32)
    batched = jax.vmap(matmul, in_axes=(None, 0))(a, b)  # a [4,6,10] against each b[i]
    expected = jnp.stack([reference_matmul(a, b[i]) for i in range(3)])
    close(batched, expected, jnp.float32)
    over_a = jax.jit(jax.vmap(matmul, in_axes=(0, None)))(a, b[0])
    close(over_a, reference_matmul(a, b[0]), jnp.float32)


def test_gradients_match_reference(rng: np.random.Generator) -> None:
    a, b = _random(rng, (2, 7, 9), jnp.float32), _random(rng, (9, 4), jnp.float32)
    cot = _random(rng, (2, 7, 4), jnp.float32)

    def loss(fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[[jax.Array, jax.Array], jax.Array]:
        return lambda x, y: jnp.sum(fn(x, y) * cot)

    got = jax.grad(loss(matmul), argnums=(0, 1))(a, b)
    want = jax.grad(loss(reference_matmul), argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        close(g, w, jnp.float32)


def test_precision_argument(rng: np.random.Generator) -> None:
    """``precision`` is an argument of ``ejk.matmul`` (it was ``MatmulConfig.precision``)."""
    a, b = _random(rng, (5, 8), jnp.float32), _random(rng, (8, 3), jnp.float32)
    for precision in ("default", "high", "highest"):
        out = ejk.matmul(a, b, precision=precision, platform="xla")
        tf32 = "matmul_default_precision"  # "default" may use TF32 on a GPU
        close(out, reference_matmul(a, b), jnp.float32, kind=tf32)
        close(matmul(a, b, precision=(precision, precision)), reference_matmul(a, b), jnp.float32, kind=tf32)


def test_config_validation_and_space(rng: np.random.Generator) -> None:
    a32, b32 = _random(rng, (4, 8), jnp.float32), _random(rng, (8, 2), jnp.float32)
    with pytest.raises(ValueError, match="precision"):
        ejk.matmul(a32, b32, precision="fast")  # JAX's alias "fastest" (= "default") is accepted
    with pytest.raises(TypeError):
        MatmulConfig("highest")  # type: ignore[call-arg]  # keyword-only, and no field at all
    with pytest.raises(TypeError):
        MatmulConfig(precision="highest")  # type: ignore[call-arg]  # an argument of ejk.matmul now
    assert attrs.fields(MatmulConfig) == ()  # only performance knobs: XLA has none to tune
    cfg = MatmulConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.block = 1  # type: ignore[attr-defined]
    a, b = jax.ShapeDtypeStruct((4, 8, 16), jnp.bfloat16), jax.ShapeDtypeStruct((16, 2), jnp.bfloat16)
    assert config_space(a, b) == [MatmulConfig()]
    assert heuristic_config(a, b) == MatmulConfig()
    assert hash(heuristic_config(a, b)) == hash(MatmulConfig())
    out = ejk.matmul(a32, b32, cfg=MatmulConfig())  # an explicit cfg still names this implementation
    close(out, reference_matmul(a32, b32), jnp.float32)


# -- check_matmul_args ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        # 1-D operands and a batched b are valid now (jnp.matmul shapes): these cases became
        # a 0-D a, a 1-D b of the wrong length and batch dimensions that do not broadcast.
        (jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((5, 2), jnp.float32),
         r"matmul: a has shape \(\) but needs \[\.\.\., m, k\]"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), jax.ShapeDtypeStruct((6,), jnp.float32),
         r"matmul: b has shape \(6,\) but needs \[k=5\]"),
        (jax.ShapeDtypeStruct((3, 4, 5), jnp.float32), jax.ShapeDtypeStruct((2, 5, 3), jnp.float32),
         r"matmul: b has shape \(2, 5, 3\)"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), jax.ShapeDtypeStruct((6, 3), jnp.float32),
         r"matmul: b has shape \(6, 3\) but needs \[k=5, n\]"),
        (jax.ShapeDtypeStruct((4, 5), jnp.int32), jax.ShapeDtypeStruct((5, 3), jnp.float32),
         r"matmul: a has dtype int32 but needs a floating dtype"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), jax.ShapeDtypeStruct((5, 3), jnp.bool_),
         r"matmul: b has dtype bool"),
        (None, jax.ShapeDtypeStruct((5, 3), jnp.float32), r"matmul: a is None"),
    ],
    ids=["a_0d", "b_1d", "b_3d", "k_mismatch", "a_int", "b_bool", "a_none"],
)
def test_check_errors(a: object, b: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_matmul_args(a, b)


def test_check_accepts_valid_and_traced() -> None:
    a, b = jnp.ones((2, 3, 4), jnp.bfloat16), jnp.ones((4, 5), jnp.float32)
    check_matmul_args(a, b)
    check_matmul_args(jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(b.shape, b.dtype))
    jax.jit(lambda x, y: check_matmul_args(x, y))(a, b)


# -- jnp.matmul shapes, precision and preferred_element_type through ejk.matmul ----------------------

JNP_SHAPES = pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((5, 7), (7, 3)),
        ((2, 5, 7), (2, 7, 3)),  # same batch
        ((3, 1, 5, 7), (4, 7, 2)),  # broadcast: [3, 1] with [4]
        ((1, 5, 7), (3, 7, 2)),  # size-1 batch of a
        ((6, 5), (2, 3, 5, 4)),  # only b batched
        ((7,), (7, 3)),  # 1-D a
        ((7,), (2, 7, 3)),  # 1-D a against a batch
        ((2, 4, 7), (7,)),  # 1-D b
        ((6,), (6,)),  # both 1-D: a scalar
        ((2, 0, 7), (7, 3)),  # empty m
        ((4, 0), (0, 3)),  # empty k: zeros
    ],
    ids=["2d", "batch", "broadcast", "a_batch1", "b_batched", "a_1d", "a_1d_batch", "b_1d", "both_1d",
         "m0", "k0"],
)


def _jnp_reference(a: jax.Array, b: jax.Array, **kw: object) -> jax.Array:
    """What ejk.matmul must match: jnp.matmul on float32 operands at full precision."""
    out_dtype = kw.get("preferred_element_type") or jnp.result_type(a, b)
    return jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST).astype(out_dtype)  # type: ignore[arg-type]


@DTYPES
@JNP_SHAPES
def test_batches_like_jnp_matmul(rng: np.random.Generator, dtype: jnp.dtype, a_shape: tuple[int, ...],
                                 b_shape: tuple[int, ...]) -> None:
    a, b = _random(rng, a_shape, dtype), _random(rng, b_shape, dtype)
    out = ejk.matmul(a, b, platform="xla")
    want = jnp.matmul(a, b)
    assert out.shape == want.shape and out.dtype == want.dtype
    close(out, _jnp_reference(a, b), dtype)


@JNP_SHAPES
def test_gradients_match_jnp_matmul(rng: np.random.Generator, a_shape: tuple[int, ...],
                                    b_shape: tuple[int, ...]) -> None:
    a, b = _random(rng, a_shape, jnp.float32), _random(rng, b_shape, jnp.float32)
    cot = _random(rng, jnp.matmul(a, b).shape, jnp.float32)

    def loss(fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable[[jax.Array, jax.Array], jax.Array]:
        return lambda x, y: jnp.sum(fn(x, y) * cot)

    got = jax.jit(jax.grad(loss(lambda x, y: ejk.matmul(x, y, platform="xla")), argnums=(0, 1)))(a, b)
    want = jax.grad(loss(_jnp_reference), argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        close(g, w, jnp.float32)


def test_bf16_gradients_and_vmap_of_broadcast(rng: np.random.Generator) -> None:
    a, b = _random(rng, (3, 1, 5, 8), jnp.bfloat16), _random(rng, (4, 8, 2), jnp.bfloat16)
    got = jax.grad(lambda x, y: ejk.matmul(x, y).astype(jnp.float32).sum(), argnums=(0, 1))(a, b)
    want = jax.grad(lambda x, y: _jnp_reference(x, y).astype(jnp.float32).sum(), argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == jnp.bfloat16
        close(g, w, jnp.bfloat16)
    batched = jax.vmap(lambda x: ejk.matmul(x, b))(a)  # vmap over a's leading axis
    close(batched, _jnp_reference(a, b), jnp.bfloat16)


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype", "preferred"),
    # bfloat16 -> float32 is the conformance suite's (test_ops.py: check_matmul with preferred_element_type).
    [(jnp.float32, jnp.float32, jnp.bfloat16), (jnp.float16, jnp.bfloat16, jnp.float16),
     (jnp.bfloat16, jnp.bfloat16, None)],
)
def test_preferred_element_type(rng: np.random.Generator, a_dtype: jnp.dtype, b_dtype: jnp.dtype,
                                preferred: jnp.dtype | None) -> None:
    a, b = _random(rng, (2, 9, 12), a_dtype), _random(rng, (12, 4), b_dtype)
    out = ejk.matmul(a, b, preferred_element_type=preferred)
    assert out.dtype == jnp.matmul(a, b, preferred_element_type=preferred).dtype
    close(out, _jnp_reference(a, b, preferred_element_type=preferred), out.dtype)


def test_preferred_float32_keeps_the_float32_sum(rng: np.random.Generator) -> None:
    """bf16 inputs, float32 output: no final bf16 rounding (the default rounds once to bf16)."""
    k = 4096
    a = jnp.ones((2, k), jnp.bfloat16)
    b = jnp.asarray(rng.uniform(0.5, 1.5, size=(k, 3)), jnp.bfloat16)
    exact = np.asarray(b, np.float64).sum(axis=0)
    out = ejk.matmul(a, b, preferred_element_type=jnp.float32)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out, np.float64), np.broadcast_to(exact, out.shape), rtol=1e-6)


def _dot_precisions(fn: Callable[[], jax.Array]) -> set[object]:
    """The ``precision`` of every dot_general in ``fn``'s jaxpr, nested jaxprs included."""
    return {eqn.params["precision"] for eqn in jaxpr_equations(jax.make_jaxpr(fn)())
            if eqn.primitive.name == "dot_general"}


def test_precision_reaches_the_implementation() -> None:
    a, b = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
    P = jax.lax.Precision
    assert _dot_precisions(lambda: ejk.matmul(a, b)) == {(P.HIGHEST, P.HIGHEST)}  # the default
    assert _dot_precisions(lambda: ejk.matmul(a, b, precision="high")) == {(P.HIGH, P.HIGH)}
    assert _dot_precisions(lambda: ejk.matmul(a, b, precision=(P.DEFAULT, "float32"))) == {(P.DEFAULT, P.HIGHEST)}
    assert _dot_precisions(lambda: ejk.matmul(a, b, precision="fastest")) == {(P.DEFAULT, P.DEFAULT)}
    with jax.default_matmul_precision("tensorfloat32"):  # None means JAX's default, as in jnp.matmul
        assert _dot_precisions(lambda: ejk.matmul(a, b, precision=None)) == {(P.HIGH, P.HIGH)}
        assert _dot_precisions(lambda: ejk.matmul(a, b)) == {(P.HIGHEST, P.HIGHEST)}  # ejk's default stays


def test_normalize_resolves_static_arguments() -> None:
    a, b = jax.ShapeDtypeStruct((3, 4), jnp.bfloat16), jax.ShapeDtypeStruct((4, 2), jnp.float16)
    _, static = ejk.ops.OPS["matmul"].kernel.normalize(a, b)
    assert static == {"precision": ("highest", "highest"), "preferred_element_type": np.dtype(jnp.float32)}
    _, static = ejk.ops.OPS["matmul"].kernel.normalize(a, b, precision=None, preferred_element_type="bfloat16")
    assert static == {"precision": ("default", "default"), "preferred_element_type": np.dtype(jnp.bfloat16)}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "fast"}, r"matmul: precision is 'fast' but needs None .* 'highest'"),
        ({"precision": 2}, r"matmul: precision is 2 but needs"),
        ({"precision": ("high",)}, r"matmul: precision is \('high',\) but needs .*pair"),
        ({"precision": jax.lax.DotAlgorithmPreset.F32_F32_F32}, r"matmul: precision is .*DotAlgorithm.* not supported"),
        ({"preferred_element_type": jnp.int32}, r"matmul: preferred_element_type is int32 but needs None "
                                                r"\(result_type\(a, b\)\) or a floating dtype"),
        ({"preferred_element_type": jnp.float64}, r"preferred_element_type is float64 .*cast to float32"),
        ({"preferred_element_type": "nope"}, r"matmul: preferred_element_type is 'nope' but needs"),
    ],
    ids=["unknown_name", "int", "one_tuple", "algorithm", "int32", "float64", "garbage"],
)
def test_static_argument_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ejk.matmul(jnp.ones((2, 3)), jnp.ones((3, 4)), **kwargs)  # type: ignore[arg-type]


def test_default_matmul_precision_that_ejk_cannot_honour() -> None:
    with jax.default_matmul_precision("BF16_BF16_F32"), pytest.raises(
            ValueError, match=r"precision is None \(from jax_default_matmul_precision='BF16_BF16_F32'\)"):
        ejk.matmul(jnp.ones((2, 3)), jnp.ones((3, 4)), precision=None)


def test_explain_cli_takes_jnp_matmul_shapes_and_numerics(capsys: pytest.CaptureFixture[str]) -> None:
    from ejk.cli import main

    assert main(["explain", "matmul", "--a", "3x1x2x4", "--b", "5x4x6", "--precision", "high",
                 "--preferred-element-type", "float32", "--json"]) == 0
    call = json.loads(capsys.readouterr().out)["call"]
    assert "3x1x2x4:bfloat16, 5x4x6:bfloat16" in call and "('high', 'high')" in call and "float32" in call
    assert main(["explain", "matmul", "--a", "4", "--b", "5", "--json"]) == 2
    assert "matmul: b has shape (5,) but needs [k=4]" in json.loads(capsys.readouterr().out)["error"]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_16bit_matmul_lowers_for_cuda_to_a_at_b_s_own_dots(dtype: jnp.dtype) -> None:
    """For 16-bit operands the products are exact whatever ``precision`` asks, so the XLA implementation hands
    XLA ``a @ b``'s own dot (and ``a @ b``'s gradient dots): XLA's GPU autotuner then weighs the same GEMMs for
    both, and the default ``"highest"`` costs nothing over ``a @ b``. A float32 call keeps its precision."""
    import re

    a, b = jnp.ones((16, 256), dtype), jnp.ones((256, 512), dtype)

    def dots(fn: Callable[..., jax.Array], *args: jax.Array) -> list[str]:
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        return [re.sub(r"%\S+", "%", line.strip()) for line in text.splitlines() if "dot_general" in line]

    def grads(product: Callable[..., jax.Array]) -> Callable[..., tuple[jax.Array, jax.Array]]:
        return jax.grad(lambda x, y: product(x, y).astype(jnp.float32).sum(), (0, 1))

    ours = functools.partial(ejk.matmul, platform="xla")
    assert dots(ours, a, b) == dots(jnp.matmul, a, b) and len(dots(ours, a, b)) == 1
    assert dots(grads(ours), a, b) == dots(grads(jnp.matmul), a, b)
    wide = a.astype(jnp.float32), b.astype(jnp.float32)
    assert all("HIGHEST" in line for line in dots(ours, *wide))
