"""The XLA grouped matmul against the reference: values, gradients, composition, memory, checks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.ops.validate import check_grouped_matmul_args
from ejk.testing import assert_close, jaxpr_equations
from ejk.testing import reference_grouped_matmul as _plain_reference
from ejk_xla._grouped_matmul import GroupedMatmulConfig, config_space, grouped_matmul, heuristic_config

pytestmark = pytest.mark.filterwarnings("error")

#: ejk.testing's comparison with the matmul rows of its tolerance table, shapes and dtypes included.
close = functools.partial(assert_close, kind="matmul", strict=True)

reference_grouped_matmul = jax.jit(_plain_reference)  # compiled once per shape: op-by-op is slow

DTYPES = pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=["f32", "f16", "bf16"])

# name -> (m, k, n, group sizes)
CASES: dict[str, tuple[int, int, int, list[int]]] = {
    "uneven": (53, 12, 10, [5, 17, 1, 22, 8]),
    "empty_groups": (53, 12, 10, [0, 20, 0, 0, 33, 0]),
    "sum_below_m": (53, 12, 10, [9, 14, 20]),
    "single_nonempty": (40, 8, 6, [0, 0, 40, 0]),
    "g1_full": (40, 8, 6, [40]),
    "g1_partial": (40, 8, 6, [13]),
    "m1": (1, 8, 6, [0, 1, 0]),
    "all_empty": (20, 8, 6, [0, 0, 0]),
    "many_small": (40, 4, 5, [3, 0, 1, 0, 0, 7, 2, 2, 0, 9, 1, 0, 4, 3, 0, 8]),
}


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), dtype)


def _case(rng: np.random.Generator, name: str, dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array, jax.Array]:
    m, k, n, sizes = CASES[name]
    return _random(rng, (m, k), dtype), _random(rng, (len(sizes), k, n), dtype), jnp.asarray(sizes, jnp.int32)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(2024)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("block_m", [1, 8, 128])
def test_matches_reference(rng: np.random.Generator, name: str, block_m: int) -> None:
    lhs, rhs, sizes = _case(rng, name)
    out = grouped_matmul(lhs, rhs, sizes, cfg=GroupedMatmulConfig(block_m=block_m))
    close(out, reference_grouped_matmul(lhs, rhs, sizes), jnp.float32)
    past_sum = int(np.sum(CASES[name][3]))
    assert not np.any(np.asarray(out)[past_sum:]), "rows past sum(group_sizes) must be zeros"


@DTYPES
@pytest.mark.parametrize("name", ["uneven", "empty_groups", "m1"])
def test_dtypes(rng: np.random.Generator, dtype: Any, name: str) -> None:
    lhs, rhs, sizes = _case(rng, name, dtype)
    out = grouped_matmul(lhs, rhs, sizes, cfg=GroupedMatmulConfig(block_m=16))
    assert out.dtype == dtype
    close(out, reference_grouped_matmul(lhs, rhs, sizes), dtype)


def test_random_shapes_and_default_config(rng: np.random.Generator) -> None:
    for _ in range(5):
        m, k, n, groups = (int(x) for x in rng.integers(1, 40, size=4))
        cuts = np.sort(rng.integers(0, m + 1, size=groups))  # sizes: gaps between sorted cuts
        sizes = jnp.asarray(np.diff(cuts, prepend=0), jnp.int32)
        lhs, rhs = _random(rng, (m, k)), _random(rng, (groups, k, n))
        close(grouped_matmul(lhs, rhs, sizes), reference_grouped_matmul(lhs, rhs, sizes), jnp.float32)


def test_output_dtype_follows_lhs(rng: np.random.Generator) -> None:
    lhs, rhs, sizes = _case(rng, "uneven", jnp.bfloat16)
    out = grouped_matmul(lhs, rhs.astype(jnp.float32), sizes)
    assert out.dtype == jnp.bfloat16
    close(out, reference_grouped_matmul(lhs, rhs.astype(jnp.float32), sizes), jnp.bfloat16)


def test_rows_outside_groups_do_not_leak(rng: np.random.Generator) -> None:
    """Non-finite values in rows past the sum never reach the output or the rhs gradient."""
    lhs, rhs, sizes = _case(rng, "sum_below_m")
    lhs = lhs.at[50:].set(jnp.inf)
    out = grouped_matmul(lhs, rhs, sizes, cfg=GroupedMatmulConfig(block_m=8))
    assert np.all(np.isfinite(out))
    assert not np.any(np.asarray(out)[43:])
    d_rhs = jax.grad(lambda r: jnp.sum(grouped_matmul(lhs, r, sizes, cfg=GroupedMatmulConfig(block_m=8))))(rhs)
    assert np.all(np.isfinite(d_rhs))


def test_no_groups_and_degenerate_shapes(rng: np.random.Generator) -> None:
    lhs = _random(rng, (5, 3))
    out = grouped_matmul(lhs, jnp.zeros((0, 3, 4)), jnp.zeros((0,), jnp.int32))
    assert out.shape == (5, 4) and not np.any(np.asarray(out))
    out = grouped_matmul(jnp.zeros((0, 3)), _random(rng, (2, 3, 4)), jnp.zeros((2,), jnp.int32))
    assert out.shape == (0, 4)
    out = grouped_matmul(jnp.zeros((5, 0)), jnp.zeros((2, 0, 4)), jnp.asarray([2, 3], jnp.int32))
    assert out.shape == (5, 4) and not np.any(np.asarray(out))


# -- gradients ------------------------------------------------------------------------------------


def _loss(fn: Callable[..., jax.Array], sizes: jax.Array, cot: jax.Array) -> Callable[..., jax.Array]:
    return lambda lhs, rhs: jnp.sum(fn(lhs, rhs, sizes).astype(jnp.float32) * cot)


@pytest.mark.parametrize(
    ("name", "block_m"),
    [("uneven", 4), ("uneven", 16), ("empty_groups", 8), ("sum_below_m", 16), ("g1_partial", 4), ("m1", 8),
     ("many_small", 4)],
)
def test_gradients_match_reference(rng: np.random.Generator, name: str, block_m: int) -> None:
    lhs, rhs, sizes = _case(rng, name)
    cot = _random(rng, (lhs.shape[0], rhs.shape[2]))
    impl = _loss(lambda x, w, s: grouped_matmul(x, w, s, cfg=GroupedMatmulConfig(block_m=block_m)), sizes, cot)
    got = jax.jit(jax.grad(impl, argnums=(0, 1)))(lhs, rhs)
    want = jax.jit(jax.grad(_loss(_plain_reference, sizes, cot), argnums=(0, 1)))(lhs, rhs)
    for g, w in zip(got, want, strict=True):
        close(g, w, jnp.float32)


def test_gradients_low_precision(rng: np.random.Generator) -> None:
    lhs, rhs, sizes = _case(rng, "uneven", jnp.bfloat16)
    cot = _random(rng, (lhs.shape[0], rhs.shape[2]))
    got = jax.jit(jax.grad(_loss(grouped_matmul, sizes, cot), argnums=(0, 1)))(lhs, rhs)
    want = jax.jit(jax.grad(_loss(_plain_reference, sizes, cot), argnums=(0, 1)))(lhs, rhs)
    assert got[0].dtype == jnp.bfloat16 and got[1].dtype == jnp.bfloat16
    for g, w in zip(got, want, strict=True):
        close(g, w, jnp.bfloat16)


def test_group_sizes_get_no_gradient(rng: np.random.Generator) -> None:
    lhs, rhs, sizes = _case(rng, "uneven")
    _, vjp = jax.vjp(grouped_matmul, lhs, rhs, sizes)
    d_lhs, d_rhs, d_sizes = vjp(jnp.ones((lhs.shape[0], rhs.shape[2])))
    assert d_lhs.shape == lhs.shape and d_rhs.shape == rhs.shape
    assert d_sizes.dtype == jax.dtypes.float0


# -- composition ----------------------------------------------------------------------------------


def test_jit_with_traced_group_sizes(rng: np.random.Generator) -> None:
    lhs, rhs, _ = _case(rng, "uneven")
    traces = []

    @jax.jit
    def run(x: jax.Array, w: jax.Array, s: jax.Array) -> jax.Array:
        traces.append(1)
        return grouped_matmul(x, w, s, cfg=GroupedMatmulConfig(block_m=8))

    for sizes in ([5, 17, 1, 22, 8], [0, 0, 53, 0, 0], [10, 0, 0, 0, 3]):
        s = jnp.asarray(sizes, jnp.int32)
        close(run(lhs, rhs, s), reference_grouped_matmul(lhs, rhs, s), jnp.float32)
    assert len(traces) == 1


def test_jit_of_grad(rng: np.random.Generator) -> None:
    lhs, rhs, sizes = _case(rng, "empty_groups")
    cot = _random(rng, (lhs.shape[0], rhs.shape[2]))
    got = jax.jit(jax.grad(_loss(grouped_matmul, sizes, cot), argnums=(0, 1)))(lhs, rhs)
    want = jax.jit(jax.grad(_loss(_plain_reference, sizes, cot), argnums=(0, 1)))(lhs, rhs)
    for g, w in zip(got, want, strict=True):
        close(g, w, jnp.float32)


def test_vmap_over_batches_of_problems(rng: np.random.Generator) -> None:
    batch, m, k, n, groups = 3, 24, 6, 5, 4
    lhs, rhs = _random(rng, (batch, m, k)), _random(rng, (batch, groups, k, n))
    sizes = jnp.asarray([[6, 6, 6, 6], [0, 24, 0, 0], [1, 0, 2, 3]], jnp.int32)
    impl = jax.vmap(lambda x, w, s: grouped_matmul(x, w, s, cfg=GroupedMatmulConfig(block_m=8)))
    out = impl(lhs, rhs, sizes)
    for i in range(batch):
        close(out[i], reference_grouped_matmul(lhs[i], rhs[i], sizes[i]), jnp.float32)
    cot = _random(rng, (batch, m, n))
    got = jax.jit(jax.grad(lambda x, w: jnp.sum(impl(x, w, sizes) * cot), argnums=(0, 1)))(lhs, rhs)
    want = jax.jit(jax.grad(
        lambda x, w: jnp.sum(jax.vmap(_plain_reference)(x, w, sizes) * cot), argnums=(0, 1)
    ))(lhs, rhs)
    for g, w in zip(got, want, strict=True):
        close(g, w, jnp.float32)


# -- memory: never a dense [g, m, n] --------------------------------------------------------------


def _jaxprs(jaxpr: Any) -> Iterator[Any]:
    """``jaxpr`` and every jaxpr nested in its equations (scan bodies, custom_vjp rules, ...)."""
    yield jaxpr
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if hasattr(sub, "eqns"):
                    yield from _jaxprs(sub)
                elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                    yield from _jaxprs(sub.jaxpr)


def _largest_intermediate(fn: Callable[..., Any], *args: Any) -> int:
    """Elements of the largest value any equation of ``fn``'s jaxpr produces."""
    closed = jax.make_jaxpr(fn)(*args)
    sizes = [int(np.prod(var.aval.shape)) for jaxpr in _jaxprs(closed.jaxpr) for eqn in jaxpr.eqns
             for var in eqn.outvars if hasattr(var.aval, "shape")]
    return max(sizes)


def test_never_materialises_dense_group_products(rng: np.random.Generator) -> None:
    m, k, n, groups = 96, 24, 40, 6
    lhs, rhs = _random(rng, (m, k)), _random(rng, (groups, k, n))
    sizes = jnp.asarray([20, 0, 30, 10, 20, 16], jnp.int32)
    limit = max(m * k, m * n, groups * k * n)  # inputs, outputs and the weight gradient
    dense = min(groups * m * n, m * k * n)

    def forward(x: jax.Array, w: jax.Array) -> jax.Array:
        return grouped_matmul(x, w, sizes, cfg=GroupedMatmulConfig(block_m=16))

    def backward(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.grad(lambda a, b: jnp.sum(forward(a, b)), argnums=(0, 1))(x, w)

    assert _largest_intermediate(_plain_reference, lhs, rhs, sizes) >= dense  # the probe sees it
    assert _largest_intermediate(forward, lhs, rhs) <= limit
    assert _largest_intermediate(backward, lhs, rhs) <= limit
    hlo = jax.jit(backward).lower(lhs, rhs).compile().as_text()
    for shape in (f"[{groups},{m},{n}]", f"[{m},{k},{n}]", f"[{m},{n},{k}]"):
        assert shape not in hlo


# -- config ---------------------------------------------------------------------------------------


def test_config_validation() -> None:
    for bad in (0, -8, 1.5, True, "64"):
        with pytest.raises(ValueError, match="block_m"):
            GroupedMatmulConfig(block_m=bad)  # type: ignore[arg-type]
    cfg = GroupedMatmulConfig(block_m=32)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.block_m = 8  # type: ignore[misc]
    assert cfg == GroupedMatmulConfig(block_m=32) and hash(cfg) == hash(GroupedMatmulConfig(block_m=32))


@pytest.mark.parametrize(("m", "groups"), [(1, 1), (7, 3), (200, 8), (4096, 64), (100_000, 2)])
def test_config_space_and_heuristic(m: int, groups: int) -> None:
    args = (jax.ShapeDtypeStruct((m, 64), jnp.bfloat16), jax.ShapeDtypeStruct((groups, 64, 32), jnp.bfloat16),
            jax.ShapeDtypeStruct((groups,), jnp.int32))
    space = config_space(*args)
    assert 1 <= len(space) <= 8
    assert len(set(space)) == len(space)
    assert all(isinstance(c, GroupedMatmulConfig) for c in space)
    heuristic = heuristic_config(*args)
    assert 1 <= heuristic.block_m <= max(8, 2 * m)


def test_every_config_in_space_is_correct(rng: np.random.Generator) -> None:
    lhs, rhs, sizes = _case(rng, "uneven")
    ref = reference_grouped_matmul(lhs, rhs, sizes)
    for cfg in config_space(lhs, rhs, sizes):
        close(grouped_matmul(lhs, rhs, sizes, cfg=cfg), ref, jnp.float32)


# -- check_grouped_matmul_args --------------------------------------------------------------------


def _abstract(shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize(
    ("lhs", "rhs", "sizes", "match"),
    [
        (_abstract((8,)), _abstract((2, 8, 4)), _abstract((2,), jnp.int32),
         r"grouped_matmul: lhs has shape \(8,\) but needs \[m, k\]"),
        (_abstract((8, 64)), _abstract((4, 32, 16)), _abstract((4,), jnp.int32),
         r"grouped_matmul: rhs has shape \(4, 32, 16\) but needs \[groups, k=64, n\]"),
        (_abstract((8, 64)), _abstract((64, 16)), _abstract((4,), jnp.int32),
         r"grouped_matmul: rhs has shape \(64, 16\) but needs \[groups, k=64, n\]"),
        (_abstract((8, 4)), _abstract((3, 4, 2)), _abstract((2,), jnp.int32),
         r"grouped_matmul: group_sizes has shape \(2,\) but needs \[groups=3\]"),
        (_abstract((8, 4)), _abstract((3, 4, 2)), _abstract((3, 1), jnp.int32),
         r"grouped_matmul: group_sizes has shape \(3, 1\)"),
        (_abstract((8, 4)), _abstract((3, 4, 2)), _abstract((3,), jnp.float32),
         r"grouped_matmul: group_sizes has dtype float32 but needs an integer dtype"),
        (_abstract((8, 4), jnp.int8), _abstract((3, 4, 2)), _abstract((3,), jnp.int32),
         r"grouped_matmul: lhs has dtype int8"),
        (_abstract((8, 4)), _abstract((3, 4, 2), jnp.int32), _abstract((3,), jnp.int32),
         r"grouped_matmul: rhs has dtype int32"),
        (_abstract((8, 4)), None, _abstract((3,), jnp.int32), r"grouped_matmul: rhs is None"),
    ],
    ids=["lhs_1d", "rhs_k", "rhs_2d", "sizes_len", "sizes_2d", "sizes_float", "lhs_int", "rhs_int", "rhs_none"],
)
def test_check_shape_errors(lhs: Any, rhs: Any, sizes: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_grouped_matmul_args(lhs, rhs, sizes)


def test_check_value_errors() -> None:
    lhs, rhs = jnp.zeros((10, 4)), jnp.zeros((3, 4, 2))
    with pytest.raises(ValueError, match=r"group_sizes has negative entries \[1\]=-2"):
        check_grouped_matmul_args(lhs, rhs, jnp.asarray([3, -2, 1], jnp.int32))
    with pytest.raises(ValueError, match=r"group_sizes sums to 11 but needs a sum <= m=10"):
        check_grouped_matmul_args(lhs, rhs, jnp.asarray([3, 4, 4], jnp.int32))
    with pytest.raises(ValueError, match="group_sizes sums to 11"):
        check_grouped_matmul_args(lhs, rhs, np.asarray([3, 4, 4]))  # NumPy values are concrete too
    with pytest.raises(ValueError, match="group_sizes sums to 12"):
        check_grouped_matmul_args(lhs, rhs, [4, 4, 4])  # and so are Python lists
    check_grouped_matmul_args(lhs, rhs, jnp.asarray([3, 0, 7], jnp.int32))
    check_grouped_matmul_args(lhs, rhs, jnp.asarray([0, 0, 0], jnp.int32))


def test_check_skips_values_under_tracing() -> None:
    lhs, rhs = jnp.zeros((10, 4)), jnp.zeros((3, 4, 2))
    bad = jnp.asarray([30, -2, 1], jnp.int32)
    jax.jit(lambda s: check_grouped_matmul_args(lhs, rhs, s))(bad)  # values unknown: no error
    check_grouped_matmul_args(lhs, rhs, _abstract((3,), jnp.int32))
    with pytest.raises(ValueError, match="group_sizes has shape"):  # shapes are still checked
        jax.jit(lambda s: check_grouped_matmul_args(lhs, rhs, s))(bad[:2])


# -- precision and preferred_element_type --------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "preferred"),
    # bfloat16 -> float32 is the conformance suite's (test_ops.py: check_grouped_matmul with
    # preferred_element_type), values and gradients.
    [(jnp.float32, jnp.bfloat16), (jnp.float16, None)],
)
def test_preferred_element_type(rng: np.random.Generator, dtype: Any, preferred: Any) -> None:
    lhs, rhs, sizes = _case(rng, "uneven", dtype)
    out = ejk.grouped_matmul(lhs, rhs, sizes, preferred_element_type=preferred)
    want_dtype = dtype if preferred is None else preferred
    assert out.dtype == want_dtype
    want = reference_grouped_matmul(lhs, rhs, sizes)
    close(out, want.astype(want_dtype), dtype)
    got_grads = jax.grad(lambda x, w: ejk.grouped_matmul(x, w, sizes, preferred_element_type=preferred)
                         .astype(jnp.float32).sum(), argnums=(0, 1))(lhs, rhs)
    want_grads = jax.grad(lambda x, w: _plain_reference(x, w, sizes).astype(jnp.float32).sum(),
                          argnums=(0, 1))(lhs, rhs)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert g.dtype == dtype  # gradients in the operands' dtypes
        close(g, w, dtype)


def test_preferred_float32_keeps_the_float32_sum() -> None:
    k = 1000
    lhs = jnp.ones((3, k), jnp.bfloat16)
    rhs = jnp.full((2, k, 2), 1.0 + 2.0**-7, jnp.bfloat16)  # k * (1 + 2^-7) = 1007.8125 is not a bf16 number
    out = ejk.grouped_matmul(lhs, rhs, jnp.asarray([1, 2], jnp.int32), preferred_element_type=jnp.float32)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), k * (1.0 + 2.0**-7), rtol=1e-6)


def _dot_precisions(fn: Callable[[], Any]) -> set[object]:
    return {eqn.params["precision"] for eqn in jaxpr_equations(jax.make_jaxpr(fn)())
            if eqn.primitive.name == "dot_general"}


def test_precision_reaches_forward_and_backward(rng: np.random.Generator) -> None:
    lhs, rhs, sizes = _case(rng, "uneven")
    P = jax.lax.Precision

    def fwd_bwd(**kw: Any) -> Callable[[], Any]:
        return lambda: jax.grad(lambda x, w: ejk.grouped_matmul(x, w, sizes, **kw).sum(), argnums=(0, 1))(lhs, rhs)

    assert _dot_precisions(fwd_bwd()) == {(P.HIGHEST, P.HIGHEST)}  # the default, as before
    assert _dot_precisions(fwd_bwd(precision="default")) == {(P.DEFAULT, P.DEFAULT)}
    _, static = ejk.ops.OPS["grouped_matmul"].kernel.normalize(lhs.astype(jnp.bfloat16), rhs, sizes)
    assert static == {"precision": ("highest", "highest"), "preferred_element_type": np.dtype(jnp.bfloat16)}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "fast"}, r"grouped_matmul: precision is 'fast' but needs None"),
        ({"preferred_element_type": jnp.int32},
         r"grouped_matmul: preferred_element_type is int32 but needs None \(lhs.dtype\) or a floating dtype"),
    ],
    ids=["precision", "preferred_element_type"],
)
def test_static_argument_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ejk.grouped_matmul(jnp.ones((4, 3)), jnp.ones((2, 3, 5)), jnp.array([1, 3], jnp.int32), **kwargs)


# -- activation="swiglu" ------------------------------------------------------------------------


@DTYPES
def test_swiglu_values_and_gradients_match_the_reference(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.standard_normal((53, 12)), dtype)
    rhs = jnp.asarray(rng.standard_normal((6, 12, 2 * 5)), dtype)
    sizes = jnp.asarray([0, 20, 0, 0, 30, 0], jnp.int32)  # empty groups, 3 rows past the sum

    def ours(a: jax.Array, b: jax.Array) -> jax.Array:
        return ejk.grouped_matmul(a, b, sizes, activation="swiglu", platform="xla")

    def ref(a: jax.Array, b: jax.Array) -> jax.Array:
        return _plain_reference(a, b, sizes, activation="swiglu")

    out, pullback = jax.vjp(ours, lhs, rhs)
    want, ref_pullback = jax.vjp(ref, lhs, rhs)
    close(out, want, dtype)
    assert out.shape == (53, 5) and not np.asarray(out[50:]).any()
    cot = jnp.asarray(rng.standard_normal(out.shape), dtype)
    for got, exp in zip(pullback(cot), ref_pullback(cot), strict=True):
        close(got, exp, dtype)


def test_swiglu_conformance() -> None:
    assert ejk.testing.check_op("grouped_matmul", "xla", activation="swiglu") == 10


def test_swiglu_with_no_rows_or_groups_is_empty_and_half_as_wide() -> None:
    assert grouped_matmul(jnp.ones((0, 4)), jnp.ones((2, 4, 6)), jnp.asarray([0, 0]),
                          activation="swiglu").shape == (0, 3)
    assert grouped_matmul(jnp.ones((5, 4)), jnp.ones((0, 4, 6)), jnp.zeros((0,), jnp.int32),
                          activation="swiglu").shape == (5, 3)


def test_composed_gate_runs_the_plain_product_then_the_activation() -> None:
    composed = ejk.ImplChoice(platform="xla", backend="any", implementation="composed")
    assert ejk.testing.check_op("grouped_matmul", "xla", activation="swiglu", cfg=composed) == 10
    lhs, rhs, sizes = jnp.ones((6, 4)), jnp.ones((2, 4, 6)), jnp.asarray([2, 3])
    with pytest.raises(ValueError, match="runs calls with an activation only"):
        ejk.grouped_matmul(lhs, rhs, sizes, cfg=composed)
    report = ejk.explain("grouped_matmul", lhs, rhs, sizes, activation="swiglu")
    assert report.chosen is not None and report.chosen.implementation == "tiled"  # fused, ahead unless ranked
    assert any(r.label == "xla/any:composed" for r in report.implementations)
