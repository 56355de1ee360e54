"""``rms_norm`` per shard: the rows (every dim of ``x`` but the last) split freely.

Each row is normalised on its own, so a shard normalises its rows with no communication; the
``scale`` gradient of a replicated ``scale`` is summed over the row shards by the implementation's
VJP (``cotangent_like``). A split last dim is gathered first: its mean square spans the shards.
A ``residual`` is split like ``x``, and so is the sum returned with it.
"""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import Axes, AxesOf, ShardPlan, Size, divides, spec

__all__ = ["rms_norm_rule"]


def rms_norm_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    x, _, residual = arrays
    taken: set[str] = set()
    dims: list[Axes] = []
    for i in range(x.ndim - 1):
        axes = divides(size, axes_of(x, i), x.shape[i])
        if set(axes) & taken:
            axes = ()
        taken.update(axes)
        dims.append(axes)
    out = spec(*dims, None)
    if residual is None:
        return ShardPlan((out, spec(None), None), out)
    return ShardPlan((out, spec(None), out), (out, out))
