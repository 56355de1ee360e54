"""The XLA RMSNorm: conformance, a float64 oracle, residuals, validation."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import check_rms_norm

pytestmark = pytest.mark.filterwarnings("error")


def test_conformance() -> None:
    assert check_rms_norm("xla") == 18  # 6 shapes and 3 with a residual, float32 and bfloat16


def test_matches_a_float64_oracle_values_and_gradients() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    scale = (1 + 0.1 * rng.standard_normal(24)).astype(np.float32)
    ct = rng.standard_normal(x.shape).astype(np.float32)
    eps = 1e-5
    y, pullback = jax.vjp(lambda x, s: ejk.rms_norm(x, s, eps=eps, platform="xla"), x, scale)
    dx, ds = pullback(jnp.asarray(ct))
    x64, s64, g64 = x.astype(np.float64), scale.astype(np.float64), ct.astype(np.float64)
    inv = 1 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps)
    normed = x64 * inv
    want_dx = inv * (g64 * s64 - normed * (g64 * s64 * normed).mean(-1, keepdims=True))
    for got, want in ((y, normed * s64), (dx, want_dx), (ds, (g64 * normed).reshape(-1, 24).sum(0))):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-5)


def test_residual_form_matches_a_float64_oracle_values_and_gradients() -> None:
    rng = np.random.default_rng(1)
    x, r, ct, dh = (rng.standard_normal((4, 40)).astype(np.float32) for _ in range(4))
    scale = (1 + 0.1 * rng.standard_normal(40)).astype(np.float32)
    (y, h), pullback = jax.vjp(lambda x, s, r: ejk.rms_norm(x, s, residual=r, platform="xla"), x, scale, r)
    dx, ds, dr = pullback((jnp.asarray(ct), jnp.asarray(dh)))
    h64, s64, g64 = x.astype(np.float64) + r, scale.astype(np.float64), ct.astype(np.float64)
    inv = 1 / np.sqrt((h64**2).mean(-1, keepdims=True) + 1e-6)
    normed = h64 * inv
    want_dx = inv * (g64 * s64 - normed * (g64 * s64 * normed).mean(-1, keepdims=True)) + dh
    for got, want in ((y, normed * s64), (h, h64), (dx, want_dx), (dr, want_dx), (ds, (g64 * normed).sum(0))):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-5)


def test_bfloat16_output_keeps_the_dtype_and_statistics_are_float32() -> None:
    x = jnp.full((2, 8), 300.0, jnp.bfloat16)  # x² overflows nothing in float32 statistics
    y = ejk.rms_norm(x, jnp.ones(8, jnp.float32), platform="xla")
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), 1.0, rtol=1e-2)
    half = ejk.rms_norm(jnp.full((1, 4), 6e4, jnp.float16), jnp.ones(4, jnp.float16), platform="xla")
    assert half.dtype == jnp.float16 and np.all(np.isfinite(np.asarray(half)))  # (6e4)² overflows float16


@pytest.mark.parametrize(("call", "match"), [
    (lambda: ejk.rms_norm(jnp.ones(()), jnp.ones(1)), r"x has shape \(\) but needs \[\.\.\., D\]"),
    (lambda: ejk.rms_norm(jnp.ones((2, 8)), jnp.ones(4)), r"scale has shape \(4,\) but needs \[D=8\]"),
    (lambda: ejk.rms_norm(jnp.ones((2, 8)), jnp.ones(8), eps=0.0), r"eps is 0.0 but needs a finite number > 0"),
    (lambda: ejk.rms_norm(jnp.ones((2, 8), jnp.int32), jnp.ones(8)), r"x has dtype int32 but needs a floating"),
    (lambda: ejk.rms_norm(jnp.ones((2, 8)), jnp.ones(8), residual=jnp.ones((1, 8))),
     r"residual has shape \(1, 8\) but needs x's shape \(2, 8\)"),
    (lambda: ejk.rms_norm(jnp.ones((2, 8)), jnp.ones(8), residual=jnp.ones((2, 8), jnp.bfloat16)),
     r"residual has dtype bfloat16 but needs x's dtype float32 .*; cast one of them"),
])
def test_bad_arguments_are_named(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
