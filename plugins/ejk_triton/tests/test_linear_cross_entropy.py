"""The Triton linear cross-entropy against the reference: options, chunk edges, dtypes, gradients, pairing.

On a CPU the kernels run through Triton's interpreter (``EJK_TRITON_INTERPRET=1``, see conftest.py)
with tiny tiles, so every shape below spans several tiles with ragged edges.
"""

from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import LINEAR_CROSS_ENTROPY_CASES, check_linear_cross_entropy
from ejk.testing import reference_linear_cross_entropy as reference
from ejk_triton import _env
from ejk_triton._linear_cross_entropy import LinearCrossEntropyConfig, capability, config_space, heuristic_config

pytestmark = [pytest.mark.filterwarnings("error"),
              pytest.mark.skipif(not (_env.nvidia_gpu()[0] or _env.interpret_mode()),
                                 reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")]

#: 16-wide tiles, two vocabulary splits and 32-column backward chunks: several of each, ragged edges.
SMALL = LinearCrossEntropyConfig(block_t=16, block_v=16, block_h=16, splits=2, chunk_v=32, num_warps=4,
                                 num_stages=2)


def test_conformance_float32() -> None:
    cases = [c for c in LINEAR_CROSS_ENTROPY_CASES if c[0] * c[2] <= 13 * 100]
    assert check_linear_cross_entropy("triton", dtypes=(jnp.float32,), cfg=SMALL, cases=cases) == len(cases)


def test_conformance_bfloat16_with_every_option() -> None:
    cases = [(20, 24, 70, "some", {"label_smoothing": 0.1, "z_loss": 1e-3, "logit_soft_cap": 4.0})]
    assert check_linear_cross_entropy("triton", dtypes=(jnp.bfloat16,), cfg=SMALL, cases=cases) == 1


def test_its_backward_runs_on_ejk_xla_forward_residuals_and_back() -> None:
    # Cross-plugin pairing: runs where both plugins are installed with the interpreter (the development venv);
    # nox's triton session installs ejk-triton alone. Each side's own forward+backward is checked by the
    # conformance tests above (triton) and ejk-xla's tests (xla).
    pytest.importorskip("ejk_xla", reason="ejk-xla is not installed: this pairs its forward and backward with ours")
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((18, 20)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((20, 33)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 33, 18), jnp.int32)
    want = jax.grad(lambda x, w: reference(x, w, labels), argnums=(0, 1))(x, w)
    backend = jax.default_backend()
    triton = ejk.ImplChoice(platform="triton", backend=backend, implementation="fused", cfg=SMALL)
    xla = ejk.ImplChoice(platform="xla", backend="any", implementation="chunked")
    for choice in (attrs.evolve(xla, backward=triton), attrs.evolve(triton, backward=xla)):
        got = jax.grad(lambda x, w, c=choice: ejk.linear_cross_entropy(x, w, labels, platform=c.platform, cfg=c),
                       argnums=(0, 1))(x, w)
        for g, r in zip(got, want, strict=True):
            np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)


def test_gate_heuristic_and_config_space() -> None:
    x = jax.ShapeDtypeStruct((16384, 4096), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((4096, 131072), jnp.bfloat16)
    labels = jax.ShapeDtypeStruct((16384,), jnp.int32)
    assert capability(x, w, labels) is None
    assert "2**30" in str(capability(x, jax.ShapeDtypeStruct((4096, 262144), jnp.bfloat16), labels))
    assert heuristic_config(x, w) == LinearCrossEntropyConfig()
    assert len(config_space(x, w)) == 5
    tiny = jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((8, 10), jnp.float32)
    assert len(config_space(*tiny)) == 4  # tiles clip to 16 x 16 x 16: only warps and stages differ
