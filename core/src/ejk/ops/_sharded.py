"""Sharded inputs without ``shard_map``: the op layer runs a call per shard where the op allows it.

When an op's arrays carry a :class:`jax.sharding.NamedSharding` over mesh axes the op can split —
batch and heads of attention, rows / columns / contraction of matmuls, experts / rows / columns /
contraction of grouped matmul, heads and tokens of paged attention (the op definition's
``shard_rule`` says which, and what communicates) — :func:`run_sharded` wraps the call in ``jax.shard_map`` over
those axes. The Executor then sees per-shard shapes, so the kernel and its config are chosen
(and tuned) for the shard each device runs; the other inputs are resharded to match, and dims
that cannot be split (a sequence-sharded ``q``) are gathered first, as the kernels need them whole.

Where shardings are visible: concrete arrays (eager calls) carry them; under ``jax.jit`` they
are part of the types only for mesh axes of type ``Explicit`` (``jax.make_mesh(...,
axis_types=(AxisType.Explicit, ...))`` with ``jax.set_mesh``). With ``Auto`` axes a traced
value's sharding is decided later by the compiler; such calls run as before (XLA partitions
them as it can).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from ejk.ops._shard_plan import Axes, Rule, ShardPlan
from ejk.parallel._vma import varying_like

__all__ = ["Rule", "ShardPlan", "run_sharded"]


def _sharding(x: Any) -> tuple[Any, Any] | None:
    """``(mesh, spec)`` of an array whose sharding is known now, with only splittable axes kept."""
    if x is None or not hasattr(x, "shape"):
        return None
    try:
        sharding = jax.typeof(x).sharding if isinstance(x, jax.core.Tracer) else getattr(x, "sharding", None)
    except Exception:
        return None
    if not isinstance(sharding, NamedSharding):
        return None
    mesh = sharding.mesh
    traced = isinstance(x, jax.core.Tracer)
    usable = {name for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
              if kind == AxisType.Explicit or (not traced and kind == AxisType.Auto)}
    if not usable:
        return None
    return mesh, sharding.spec


def run_sharded(rule: Rule | None, arrays: tuple[Any, ...], call: Callable[..., Any],
                static: Mapping[str, Any] | None = None) -> tuple[bool, Any]:
    """Run ``call(*arrays)`` per shard when the op's ``rule`` splits it: ``(True, out)``; else ``(False, None)``.

    ``call`` also takes keyword overrides of the op's ``static`` arguments (a rule's body may
    ask for float32 partial results, for instance).
    """
    if rule is None:
        return False, None
    found = [s for s in (_sharding(x) for x in arrays) if s is not None]
    if not found:
        return False, None
    mesh = found[0][0]
    if not any(part for _, spec in found for part in spec):
        return False, None  # replicated everywhere: nothing to split or gather
    by_id = {id(x): s for x in arrays if (s := _sharding(x)) is not None and s[0] == mesh}
    usable = {name for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
              if kind in (AxisType.Explicit, AxisType.Auto)}

    def axes_of(x: Any, dim: int) -> Axes:
        entry = by_id.get(id(x))
        if entry is None or dim >= len(entry[1]):
            return ()
        part = entry[1][dim]
        axes = (part,) if isinstance(part, str) else tuple(part or ())
        return axes if axes and all(a in usable for a in axes) else ()

    def size(axes: Axes) -> int:
        return math.prod(int(mesh.shape[a]) for a in axes)

    plan = (rule(arrays, axes_of, size, static=dict(static or {}))  # type: ignore[call-arg]
            if _takes_static(rule) else rule(arrays, axes_of, size))
    if plan is None:
        return False, None
    if not isinstance(plan, ShardPlan):
        plan = ShardPlan(*plan)
    def typed(*given: Any, **override: Any) -> Any:
        # Every array varies along the same mesh axes: a custom VJP then returns cotangents of
        # its primals' types, and the cast's transpose sums a replicated operand's gradient.
        return call(*varying_like(given, *[x for x in given if x is not None]), **override)

    inner = typed if plan.body is None else plan.body(typed, dict(static or {}))
    present = [i for i, x in enumerate(arrays) if x is not None]

    def local(*given: Any) -> Any:
        full = list(arrays)
        for i, x in zip(present, given, strict=True):
            full[i] = x
        return inner(*full)

    specs = tuple(plan.in_specs[i] for i in present)
    mapped = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=plan.out_specs)
    return True, mapped(*(_placed(arrays[i], mesh, spec) for i, spec in zip(present, specs, strict=True)))


@functools.lru_cache(maxsize=64)
def _takes_static(rule: Rule) -> bool:
    """Whether ``rule`` takes the op's static arguments (a ``static`` keyword: its specs depend on them)."""
    try:
        return "static" in inspect.signature(rule).parameters
    except (TypeError, ValueError):
        return False


def _placed(x: Any, mesh: Any, spec: P) -> Any:
    """``x`` laid out as ``spec`` over ``mesh`` (explicit sharding types must match ``in_specs`` exactly)."""
    current = _sharding(x)
    if current is not None and current[0] == mesh and _normal(current[1], x.ndim) == _normal(spec, x.ndim):
        return x
    if isinstance(x, jax.core.Tracer):
        return jax.reshard(x, NamedSharding(mesh, spec))
    return jax.device_put(x, NamedSharding(mesh, spec))


def _normal(spec: Any, ndim: int) -> tuple[Any, ...]:
    parts = [None if not p else ((p,) if isinstance(p, str) else tuple(p)) for p in tuple(spec)]
    return tuple(parts + [None] * (ndim - len(parts)))
