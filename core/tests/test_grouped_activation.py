"""``grouped_matmul(..., activation="swiglu")``: validation, the reference against a float64 formula,
``gated_gradients`` (an implementation's plain backward turned into the
gated one), and the extension rule: an implementation that does not name ``activation`` runs plain calls only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.ops import GroupedMatmulKernel, ImplChoice, gated_cotangent, gated_gradients, gated_output
from ejk.plugin import GROUPED_MATMUL_RESIDUALS, operand_vjp
from ejk.plugins import PlatformStatus, PluginHost
from ejk.testing import assert_close, reference_grouped_matmul

SIZES = jnp.asarray([5, 0, 9, 3], jnp.int32)  # an empty group; 3 rows past the sum


def _inputs(dtype: Any = jnp.float32, n: int = 12) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((20, 8)), dtype), jnp.asarray(rng.standard_normal((4, 8, n)), dtype))


def _swiglu64(lhs: Any, rhs: Any, sizes: Any) -> np.ndarray:
    """The op's definition in float64: rows of group i times rhs[i], then silu(gate) * up."""
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2] // 2))
    start = 0
    for i, size in enumerate(np.asarray(sizes)):
        z = lhs[start:start + size] @ rhs[i]
        gate, up = z[:, : z.shape[1] // 2], z[:, z.shape[1] // 2:]
        out[start:start + size] = gate / (1.0 + np.exp(-gate)) * up
        start += size
    return out


def test_bad_activations_name_the_argument_and_the_fix() -> None:
    lhs, rhs = _inputs()
    with pytest.raises(ValueError, match=r"activation='gelu' is not supported; pass None .* \('swiglu',\)"):
        ejk.grouped_matmul(lhs, rhs, SIZES, activation="gelu")
    with pytest.raises(ValueError, match=r"needs rhs \[groups, k, 2n\] .* odd number of columns"):
        ejk.grouped_matmul(lhs, rhs[:, :, :11], SIZES, activation="swiglu")


def test_the_reference_matches_a_float64_formula() -> None:
    lhs, rhs = _inputs()
    ref = reference_grouped_matmul(lhs, rhs, SIZES, activation="swiglu")
    assert ref.shape == (20, 6) and not np.asarray(ref[17:]).any()  # rows past the sum
    np.testing.assert_allclose(np.asarray(ref), _swiglu64(lhs, rhs, SIZES), rtol=1e-5, atol=1e-5)


def test_gated_cotangent_is_the_activations_vjp() -> None:
    z = jnp.asarray(np.random.default_rng(1).standard_normal((7, 10)), jnp.float32)
    d_out = jnp.asarray(np.random.default_rng(2).standard_normal((7, 5)), jnp.float32)
    _, pullback = jax.vjp(lambda z: gated_output(z, "swiglu"), z)
    assert_close(gated_cotangent(z, d_out, "swiglu"), pullback(d_out)[0], jnp.float32)
    assert gated_output(z, None) is z


def _plain_forward(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, precision: Any,
                   preferred_element_type: Any, cfg: Any = None, activation: str | None = None) -> jax.Array:
    z = reference_grouped_matmul(lhs, rhs, group_sizes, precision=precision,
                                 preferred_element_type=jnp.float32)
    return gated_output(z, activation).astype(preferred_element_type)


def _plain_gradients(operands: tuple[Any, ...], d_out: jax.Array, *, precision: Any, preferred_element_type: Any,
                     cfg: Any = None) -> tuple[Any, ...]:
    lhs, rhs, sizes = operands
    _, pullback = jax.vjp(lambda a, b: reference_grouped_matmul(a, b, sizes, precision=precision), lhs, rhs)
    return (*pullback(d_out.astype(lhs.dtype)), None)


def test_gated_gradients_recompute_the_product_and_run_the_plain_backward() -> None:
    lhs, rhs = _inputs()
    backward = gated_gradients(_plain_forward, _plain_gradients)
    d_out = jnp.ones((20, 6), jnp.float32)
    static = {"precision": ("highest", "highest"), "preferred_element_type": np.dtype(np.float32)}
    got = backward((lhs, rhs, SIZES), d_out, activation="swiglu", **static)
    _, pullback = jax.vjp(lambda a, b: reference_grouped_matmul(a, b, SIZES, activation="swiglu"), lhs, rhs)
    for g, w in zip(got[:2], pullback(d_out), strict=True):
        assert_close(g, w, jnp.float32)
    assert got[2] is None
    plain = backward((lhs, rhs, SIZES), jnp.ones((20, 12)), **static)  # without an activation: unchanged
    for g, w in zip(plain[:2], _plain_gradients((lhs, rhs, SIZES), jnp.ones((20, 12)), **static)[:2], strict=True):
        assert_close(g, w, jnp.float32)


def _old(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, precision: Any, preferred_element_type: Any,
         cfg: Any = None) -> jax.Array:
    """An implementation written before ``activation``."""
    return _plain_forward(lhs, rhs, group_sizes, precision=precision, preferred_element_type=preferred_element_type)


def _plugin() -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("grouped_matmul", "xla", "any", 10, name="old",
                     vjp=operand_vjp(_old, _plain_gradients, GROUPED_MATMUL_RESIDUALS))(_old)
            register("grouped_matmul", "xla", "any", 0, name="new",
                     vjp=operand_vjp(_plain_forward, gated_gradients(_plain_forward, _plain_gradients),
                                     GROUPED_MATMUL_RESIDUALS))(_plain_forward)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="xla", available=True)

    return Plugin()


def test_an_implementation_without_activation_runs_plain_calls_only(tmp_path: Path) -> None:
    host: PluginHost = ejk.plugins.get_plugin_host()  # the private, empty host of conftest
    host.register_plugin(_plugin(), "gated")
    kernel = GroupedMatmulKernel(host.registry)
    executor: ejk.Executor[Any, Any] = ejk.Executor(ejk.ConfigSelectorChain(persistent_dir=tmp_path))

    def run(lhs: Any, rhs: Any, cfg: Any = None, **kwargs: Any) -> Any:
        arrays, static = kernel.normalize(lhs, rhs, SIZES, **kwargs)
        return executor(kernel, *arrays, cfg=cfg, platform="auto", **static)

    lhs, rhs = _inputs()
    assert "activation" not in kernel.normalize(lhs, rhs, SIZES)[1]  # plain calls keep their cache keys
    gated, plain = (ejk.explain(kernel, lhs, rhs, SIZES, executor=executor, **kw) for kw in ({"activation": "swiglu"},
                                                                                             {}))
    assert gated.chosen is not None and plain.chosen is not None
    assert gated.chosen.implementation == "new" and "does not take activation=" in str(gated)
    assert plain.chosen.implementation == "old"

    def loss(lhs: Any, rhs: Any) -> Any:
        return jnp.sum(run(lhs, rhs, activation="swiglu") ** 2)

    got = jax.value_and_grad(loss, argnums=(0, 1))(lhs, rhs)
    want = jax.value_and_grad(lambda a, b: jnp.sum(reference_grouped_matmul(a, b, SIZES, activation="swiglu") ** 2),
                              argnums=(0, 1))(lhs, rhs)
    assert_close(got[0], want[0], jnp.float32)
    for g, w in zip(got[1], want[1], strict=True):
        assert_close(g, w, jnp.float32)
    with pytest.raises(ValueError, match=r"does not take activation= \(added to grouped_matmul in ejk-core 0.2.0"):
        run(lhs, rhs, activation="swiglu", cfg=ImplChoice(platform="xla", backend="any", implementation="old"))
