"""Scale-out on JAX's SPMD machinery: ring attention and sequence layouts.

``ejk.ring_attention`` runs inside ``jax.shard_map``; :func:`to_layout` / :func:`from_layout`
permute a sequence into the load-balanced layouts it accepts. The ring (which imports the ops)
is loaded on first access, so plugins may import :func:`varying_like` and :func:`cotangent_like` from here cheaply.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ejk.parallel._layout import LAYOUTS, Layout, from_layout, layout_positions, to_layout
from ejk.parallel._vma import cotangent_like, varying_axes, varying_like

if TYPE_CHECKING:
    from ejk.parallel._ring import ring_ablation, ring_attention, ring_schedule

__all__ = ["LAYOUTS", "Layout", "cotangent_like", "from_layout", "layout_positions", "ring_ablation", "ring_attention",
           "ring_schedule", "to_layout", "varying_axes", "varying_like"]


def __getattr__(name: str) -> Any:
    if name in ("ring_ablation", "ring_attention", "ring_schedule"):
        return getattr(importlib.import_module("ejk.parallel._ring"), name)
    raise AttributeError(f"module 'ejk.parallel' has no attribute {name!r}")
