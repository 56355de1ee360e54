"""Sharded inputs without ``shard_map``: the op layer runs a call per shard where the op allows it.

When an op's leading array carries a :class:`jax.sharding.NamedSharding` over mesh axes the op can
split independently — batch and heads of attention, rows / columns of matmuls, columns of grouped
matmul, heads of paged attention — :func:`run_sharded` wraps the call in ``jax.shard_map`` over
those axes. The Executor then sees per-shard shapes, so the kernel and its config are chosen
(and tuned) for the shard each device runs; the other inputs are resharded to match, and dims
that cannot be split (a sequence-sharded ``q``) are gathered first, as the kernels need them whole.

Where shardings are visible: concrete arrays (eager calls) carry them; under ``jax.jit`` they
are part of the types only for mesh axes of type ``Explicit`` (``jax.make_mesh(...,
axis_types=(AxisType.Explicit, ...))`` with ``jax.set_mesh``). With ``Auto`` axes a traced
value's sharding is decided later by the compiler; such calls run as before (XLA partitions
them as it can). Dimensions that cannot be split (sequence of attention, contraction of
matmuls, rows of grouped matmul, which depend on the group offsets) are never split here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["SHARD_RULES", "run_sharded"]

Axes = tuple[str, ...]
AxesOf = Callable[[Any, int], Axes]
Size = Callable[[Axes], int]
#: ``rule(arrays, axes_of, size) -> (in_specs per array, out_specs) | None`` (``None``: the op cannot be
#: wrapped, call it as is): ``axes_of(x, dim)`` gives
#: the splittable mesh axes one dim of an input is sharded over (``()``: unsplit), ``size(axes)``
#: the number of shards they make.
Rule = Callable[[tuple[Any, ...], AxesOf, Size], "tuple[tuple[Any, ...], Any] | None"]


def _spec(*dims: Axes | None) -> P:
    return P(*[None if not d else (d[0] if len(d) == 1 else d) for d in dims])


def _heads(axes_of: AxesOf, size: Size, q: Any, q_dim: int, kv: Any,
           kv_dim: int) -> tuple[Axes, Axes]:
    """Axes splitting query heads and kv heads so that head ``h`` still uses kv head ``h // G``."""
    axes = axes_of(q, q_dim)
    parts = size(axes)
    if not axes or q.shape[q_dim] % parts:
        return (), ()
    if kv.shape[kv_dim] % parts == 0:
        return axes, axes
    return (axes, ()) if kv.shape[kv_dim] == 1 else ((), ())


def _divides(size: Size, axes: Axes, *extents: int) -> Axes:
    return axes if axes and all(e % size(axes) == 0 for e in extents) else ()


def _attention(lse: bool) -> Rule:
    def rule(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> Any:
        q, k, v, q_seg, kv_seg, bias = arrays
        batch = _divides(size, axes_of(q, 0), q.shape[0])
        heads, kv_heads = _heads(axes_of, size, q, 2, k, 2)
        specs: list[P | None] = [_spec(batch, None, heads, None), _spec(batch, None, kv_heads, None),
                                 _spec(batch, None, kv_heads, None), _spec(batch, None), _spec(batch, None)]
        bias_spec = None
        if bias is not None:
            bias_spec = _spec(batch if bias.shape[0] > 1 else None, heads if bias.shape[1] > 1 else None, None, None)
        specs = [s if x is not None else None for s, x in zip(specs, (q, k, v, q_seg, kv_seg), strict=True)]
        out = _spec(batch, None, heads, None)
        return (*specs, bias_spec), ((out, _spec(batch, heads, None)) if lse else out)

    return rule


def _matmul(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> Any:
    a, b = arrays
    if a.ndim < 2 or b.ndim != 2:
        return None
    lead = [_divides(size, axes_of(a, d), a.shape[d]) for d in range(a.ndim - 1)]
    cols = _divides(size, axes_of(b, 1), b.shape[1])
    if set(cols) & {x for axes in lead for x in axes}:
        cols = ()
    return (_spec(*lead, None), _spec(None, cols)), _spec(*lead, cols)


def _grouped(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> Any:
    rhs = arrays[1]
    cols = _divides(size, axes_of(rhs, 2), rhs.shape[2])
    return (_spec(None, None), _spec(None, None, cols), _spec(None)), _spec(None, cols)


def _paged(arrays: tuple[Any, ...], axes_of: AxesOf, size: Size) -> Any:
    q, k_pages, _, *rest = arrays
    heads, kv_heads = _heads(axes_of, size, q, 1, k_pages, 2)
    pages = _spec(None, None, kv_heads, None)
    return (_spec(None, heads, None), pages, pages, *[_spec(*([None] * x.ndim)) for x in rest]), \
        _spec(None, heads, None)


#: Per op: how a call splits. Third-party ops may add theirs (same signature).
SHARD_RULES: dict[str, Rule] = {
    "flash_attention": _attention(lse=False),
    "flash_attention_lse": _attention(lse=True),
    "matmul": _matmul,
    "grouped_matmul": _grouped,
    "ragged_paged_attention": _paged,
}


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


def run_sharded(op_id: str, arrays: tuple[Any, ...], call: Callable[..., Any]) -> tuple[bool, Any]:
    """Run ``call(*arrays)`` per shard when the op's rule splits it: ``(True, out)``; else ``(False, None)``."""
    rule = SHARD_RULES.get(op_id)
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

    plan = rule(arrays, axes_of, size)
    if plan is None:
        return False, None
    in_specs, out_specs = plan
    present = [i for i, x in enumerate(arrays) if x is not None]

    def local(*given: Any) -> Any:
        full = list(arrays)
        for i, x in zip(present, given, strict=True):
            full[i] = x
        return call(*full)

    specs = tuple(in_specs[i] for i in present)
    mapped = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=out_specs)
    return True, mapped(*(_placed(arrays[i], mesh, spec) for i, spec in zip(present, specs, strict=True)))


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
