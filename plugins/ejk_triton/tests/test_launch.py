"""``_launch.launch``: outputs start as zeros only where asked for (as on a GPU, where a memset does it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk_triton import _env
from ejk_triton._launch import launch


def _first_half_kernel() -> object:
    """A kernel that writes ``x + 1`` into the first half of both outputs and leaves the rest alone."""
    _env.import_triton()
    import triton
    import triton.language as tl

    @triton.jit
    def first_half(x_ptr, out_ptr, counts_ptr, n: tl.constexpr):
        offs = tl.arange(0, n // 2)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + 1.0)
        tl.store(counts_ptr + offs, offs)

    return first_half


@pytest.mark.parametrize("zeroed", [(), (0, 1)])
def test_only_zeroed_outputs_start_as_zeros(zeroed: tuple[int, ...]) -> None:
    x = jnp.arange(8, dtype=jnp.float32)
    out, counts = jax.jit(lambda x: launch(
        _first_half_kernel(), grid=(1,), inputs=(x,),
        out_shapes=(jax.ShapeDtypeStruct((8,), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.int32)),
        num_warps=1, num_stages=1, zeroed_outputs=zeroed, n=8))(x)
    np.testing.assert_array_equal(np.asarray(out)[:4], [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(np.asarray(counts)[:4], [0, 1, 2, 3])
    if zeroed:
        np.testing.assert_array_equal(np.asarray(out)[4:], 0.0)
        np.testing.assert_array_equal(np.asarray(counts)[4:], 0)
    elif _env.interpret_mode():  # on a GPU the unwritten half holds whatever the buffer held
        assert np.isnan(np.asarray(out)[4:]).all()
        assert (np.asarray(counts)[4:] != 0).all()
