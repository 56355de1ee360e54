"""``ejk.ops.without_residuals`` / ``with_natural_lse``: implementation callables derived from a VJP forward."""

from __future__ import annotations

import inspect
import math

import jax.numpy as jnp
import numpy as np

from ejk.ops import LSE2_INDEX, natural_lse, with_natural_lse, without_residuals


def forward_with_residuals(q: jnp.ndarray, *, scale: float, cfg: object = None) -> tuple[jnp.ndarray, tuple]:
    """A stand-in flash forward: out = q * scale; residuals laid out as FLASH_RESIDUALS (q, k, v, q / kv segment
    ids, bias, out, then the base-2 lse at LSE2_INDEX, +inf for an empty row)."""
    lse2 = jnp.asarray([1.0, jnp.inf, -2.0], jnp.float32)
    return q * scale, (q, q, q, None, None, None, q * scale, lse2)[:LSE2_INDEX + 1]


def test_without_residuals_keeps_the_parameters_and_drops_the_residuals() -> None:
    forward = without_residuals(forward_with_residuals)
    q = jnp.arange(3.0)
    np.testing.assert_array_equal(forward(q, scale=2.0), q * 2.0)
    params = inspect.signature(forward).parameters
    assert list(params) == ["q", "scale", "cfg"] and params["cfg"].default is None
    assert inspect.signature(forward).return_annotation is inspect.Signature.empty
    assert forward.__name__ == "forward" and without_residuals(forward_with_residuals, "other").__name__ == "other"


def test_with_natural_lse_converts_base_two_and_keeps_the_residuals() -> None:
    lse_forward = with_natural_lse(forward_with_residuals)
    q = jnp.arange(3.0)
    (out, lse), residuals = lse_forward(q, scale=3.0)
    np.testing.assert_array_equal(out, q * 3.0)
    np.testing.assert_allclose(lse, [math.log(2.0), -np.inf, -2.0 * math.log(2.0)], rtol=1e-6)
    assert residuals[LSE2_INDEX][1] == np.inf  # the residuals keep the base-2 lse
    np.testing.assert_array_equal(natural_lse(jnp.asarray([jnp.inf])), [-np.inf])
    outputs = without_residuals(lse_forward, "forward_lse")(q, scale=3.0)
    np.testing.assert_array_equal(outputs[1], lse)
