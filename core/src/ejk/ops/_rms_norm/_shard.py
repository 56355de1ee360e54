"""``rms_norm`` per shard: the rows (every dim of ``x`` but the last) split freely.

Each row is normalised on its own, so a shard normalises its rows with no communication; the
``scale`` gradient of a replicated ``scale`` is summed over the row shards by the implementation's
VJP (``cotangent_like``). A split last dim is gathered first: its mean square spans the shards.
"""

from __future__ import annotations

from typing import Any

from ejk.ops._shard_plan import Axes, AxesOf, ShardPlan, Size, divides, spec

__all__ = ["rms_norm_rule"]


def rms_norm_rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> ShardPlan:
    x, _ = arrays
    taken: set[str] = set()
    dims: list[Axes] = []
    for i in range(x.ndim - 1):
        axes = divides(size, axes_of(x, i), x.shape[i])
        if set(axes) & taken:
            axes = ()
        taken.update(axes)
        dims.append(axes)
    out = spec(*dims, None)
    return ShardPlan((out, spec(None)), out)
