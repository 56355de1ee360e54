"""Values under ``shard_map``: make initial values vary along the same mesh axes as the data.

Inside ``shard_map`` JAX tracks which mesh axes each value varies along. A loop whose carry
starts as a constant (``jnp.zeros``) but is updated with per-shard data changes that type,
which ``lax.scan`` / ``fori_loop`` reject. :func:`varying_like` casts the initial carry to
vary along every axis the inputs vary along (kernel plugins use it to type the outputs of a
custom call, which does not propagate the axes); :func:`cotangent_like` sums a custom VJP's
cotangent over the axes its primal does not vary along (the transpose of the implicit
broadcast of a replicated operand). Outside ``shard_map`` both return their argument unchanged.
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax

__all__ = ["cotangent_like", "varying_axes", "varying_like"]

T = TypeVar("T")


def varying_axes(x: Any) -> frozenset[str]:
    """The mesh axes ``x`` varies along (empty outside ``shard_map``)."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # jax 0.10+: ManualAxisType(varying=...)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", None) or ())  # earlier spelling


def varying_like(tree: T, *refs: Any) -> T:
    """``tree`` with each array leaf cast to vary along the mesh axes any of ``refs`` varies along."""
    axes: frozenset[str] = frozenset()
    for ref in jax.tree.leaves(refs):
        axes |= varying_axes(ref)
    if not axes:
        return tree

    def cast(x: Any) -> Any:
        missing = tuple(sorted(axes - varying_axes(x)))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)  # type: ignore[no-any-return]


def cotangent_like(cotangent: jax.Array, primal: Any) -> jax.Array:
    """``cotangent`` summed over the mesh axes it varies along but ``primal`` does not."""
    extra = tuple(sorted(varying_axes(cotangent) - varying_axes(primal)))
    return jax.lax.psum(cotangent, extra) if extra else cotangent
