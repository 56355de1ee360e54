"""``shard_map`` varying-axes types around kernel calls.

Inside ``shard_map`` (with its type checks on) JAX tracks the mesh axes each value varies along.
A kernel call (a callback or a custom call) does not propagate them, and a custom VJP's
cotangents must have their primal's type. :func:`vary_like` types a kernel's outputs as varying
wherever its inputs do; :func:`cotangent_like` sums a cotangent over the axes its primal does
not vary along (the transpose of the implicit broadcast of a replicated operand, as JAX's own
autodiff does). Outside ``shard_map`` both return their argument unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

__all__ = ["cotangent_like", "vary_like"]


def _axes(x: Any) -> frozenset[str]:
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # jax 0.10+: ManualAxisType(varying=...)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", None) or ())  # earlier spelling


def vary_like(outs: tuple[jax.Array, ...], inputs: Sequence[jax.Array]) -> tuple[jax.Array, ...]:
    """``outs`` typed as varying along every mesh axis any of ``inputs`` varies along."""
    axes = frozenset().union(*(_axes(x) for x in inputs))
    if not axes:
        return outs
    return tuple(jax.lax.pcast(o, tuple(sorted(axes - _axes(o))), to="varying") if axes - _axes(o) else o
                 for o in outs)


def cotangent_like(cotangent: jax.Array, primal: Any) -> jax.Array:
    """``cotangent`` summed over the mesh axes it varies along but ``primal`` does not."""
    extra = tuple(sorted(_axes(cotangent) - _axes(primal)))
    return jax.lax.psum(cotangent, extra) if extra else cotangent
