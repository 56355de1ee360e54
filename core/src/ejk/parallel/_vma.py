"""Values under ``shard_map``: make initial values vary along the same mesh axes as the data.

Inside ``shard_map`` JAX tracks which mesh axes each value varies along. A loop whose carry
starts as a constant (``jnp.zeros``) but is updated with per-shard data changes that type,
which ``lax.scan`` / ``fori_loop`` reject. :func:`varying_like` casts the initial carry to
vary along every axis the inputs vary along; outside ``shard_map`` it returns it unchanged.
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax

__all__ = ["varying_like"]

T = TypeVar("T")


def _axes(x: Any) -> frozenset[str]:
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # jax 0.10+: ManualAxisType(varying=...)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", None) or ())  # earlier spelling


def varying_like(tree: T, *refs: Any) -> T:
    """``tree`` with each array leaf cast to vary along the mesh axes any of ``refs`` varies along."""
    axes: frozenset[str] = frozenset()
    for ref in jax.tree.leaves(refs):
        axes |= _axes(ref)
    if not axes:
        return tree

    def cast(x: Any) -> Any:
        missing = tuple(sorted(axes - _axes(x)))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)  # type: ignore[no-any-return]
