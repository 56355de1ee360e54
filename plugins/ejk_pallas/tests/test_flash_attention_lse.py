"""``ejk.flash_attention_lse`` on ejk-pallas: derived from the flash kernels' VJP (whose backward takes
the lse cotangent), values and gradients through both outputs against the reference.

On a CPU the kernels run in Pallas's interpret mode (``EJK_PALLAS_INTERPRET=1``, see conftest.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import FLASH_ATTENTION_CASES, check_op
from ejk_pallas import _env
from ejk_pallas._flash_attention import FlashAttentionConfig

ON_GPU = _env.nvidia_gpu()[0]
pytestmark = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                reason="needs an NVIDIA GPU or EJK_PALLAS_INTERPRET=1")

SMALL = FlashAttentionConfig(block_q=16, block_k=16, bwd_block_q=16, bwd_block_k=16)
#: The Triton-lowered kernels (a forced platform runs the best usable one; interpret mode has only these).
CHOICE = ejk.ops.ImplChoice(platform="pallas", backend="gpu" if ON_GPU else "cpu", implementation="triton_lowered",
                            cfg=SMALL)


def test_provided_by_the_flash_kernels() -> None:
    labels = [spec.label for spec in ejk.ops.get_op("flash_attention_lse").kernel.implementations()]
    assert f"pallas/{CHOICE.backend}:triton_lowered" in labels


def test_lse_conformance_subset() -> None:
    # Causal GQA, window + soft cap, segments and Sq > Sk (rows that see no key: zeros, lse -inf).
    cases = [FLASH_ATTENTION_CASES[i] for i in (1, 5, 7, 8)]
    assert check_op("flash_attention_lse", "pallas", dtypes=(jnp.bfloat16,), cases=cases, cfg=CHOICE) == 4


def test_rows_that_see_no_key_get_no_gradient_from_a_nan_lse_cotangent() -> None:
    # Non-causal window (0, 0) with Sq = 12 > Sk = 4: rows 0-7 see no key.
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal(s, dtype=np.float32), jnp.bfloat16)
               for s in ((1, 12, 2, 16), (1, 4, 2, 16), (1, 4, 2, 16)))

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        return ejk.flash_attention_lse(q, k, v, sliding_window=(0, 0), platform="pallas", cfg=CHOICE)

    (out, lse), pullback = jax.vjp(f, q, k, v)
    d_lse = jnp.where(jnp.isfinite(lse), 1.0, jnp.nan)  # NaN exactly on the rows that see nothing
    dq, dk, dv = pullback((jnp.ones_like(out), d_lse))
    assert np.all(np.isneginf(np.asarray(lse[:, :, :8]))) and np.all(np.isfinite(np.asarray(lse[:, :, 8:])))
    assert not np.asarray(out[:, :8], np.float32).any()
    for grad in (dq, dk, dv):
        assert np.isfinite(np.asarray(grad, np.float32)).all()
    assert not np.asarray(dq[:, :8], np.float32).any()
