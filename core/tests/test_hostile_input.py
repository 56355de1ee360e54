"""Hostile arguments to the public helpers (issue 28): a clear ValueError naming the argument."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.parametrize("axis", [3, -4, 1.5])
def test_to_layout_names_a_bad_axis(axis: Any) -> None:
    import jax.numpy as jnp

    from ejk.parallel import from_layout, to_layout

    x = jnp.zeros((2, 8, 4))
    for fn in (to_layout, from_layout):
        with pytest.raises(ValueError, match=r"axis=.* is not an axis of an array of 3 dimensions"):
            fn(x, "zigzag", 2, axis=axis)
