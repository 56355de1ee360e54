"""Meshes from ``--mesh``, parameter shardings (FSDP, experts) and the helpers the model uses under a mesh.

Everything runs with *explicit* mesh axes (``jax.set_mesh`` with ``AxisType.Explicit``): arrays carry
their shardings in their types, so ejk's ops see them and run per shard. The batch's rows are split over
every mesh axis but ``seq``, which splits each row's tokens (attention then runs as a ring); weights are
split over ``fsdp`` (their largest divisible dim) and gathered where a layer uses them (the gather's
transpose is the gradients' reduce-scatter); expert weights are split over ``expert`` by expert and stay
split: ``ejk.grouped_matmul`` runs each device's experts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

__all__ = ["AXES", "batch_axes", "expert_axis", "field_sharding", "gather", "make_mesh", "param_shardings",
           "parse_mesh", "per_device", "seq_axis", "take_rows", "token_spec"]

#: The mesh axes ``--mesh`` may name.
AXES = ("data", "fsdp", "expert", "seq")


def parse_mesh(text: str | None) -> dict[str, int]:
    """``"data=4"`` / ``"fsdp=2,expert=2"`` → ``{"fsdp": 2, "expert": 2}`` (``None`` or ``""`` → ``{}``)."""
    if not text:
        return {}
    sizes: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        name = name.strip()
        if name not in AXES or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(f"--mesh {text!r}: each part must be AXIS=SIZE with AXIS in {AXES} and SIZE >= 1")
        if name in sizes:
            raise ValueError(f"--mesh {text!r} names {name!r} twice")
        sizes[name] = int(size)
    return sizes


def make_mesh(sizes: dict[str, int]) -> jax.sharding.Mesh | None:
    """An explicit-axes mesh over the first ``prod(sizes)`` devices (``None`` for no axes)."""
    if not sizes:
        return None
    need = int(np.prod(list(sizes.values())))
    have = jax.device_count()
    if need > have:
        raise ValueError(f"--mesh needs {need} devices but JAX sees {have} "
                         "(on the CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    names = tuple(sizes)
    return jax.make_mesh(tuple(sizes.values()), names, axis_types=(AxisType.Explicit,) * len(names),
                         devices=jax.devices()[:need])


def _mesh_sizes() -> dict[str, int]:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return {}
    return {name: int(size) for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=True)}


def batch_axes() -> tuple[str, ...]:
    """The current mesh's axes that split the batch's rows (all but ``seq``), ``()`` outside a mesh."""
    return tuple(a for a in _mesh_sizes() if a != "seq")


def expert_axis() -> str | None:
    """``"expert"`` when the current mesh has that axis."""
    return "expert" if "expert" in _mesh_sizes() else None


def seq_axis() -> str | None:
    """``"seq"`` when the current mesh splits each row's tokens."""
    return "seq" if "seq" in _mesh_sizes() else None


def _spec(kind: str, names: tuple[str, ...]) -> PartitionSpec:
    rows = tuple(a for a in names if a != "seq") or None
    if kind == "t":  # [B, T, ...]: rows and tokens
        return PartitionSpec(rows, "seq" if "seq" in names else None)
    if kind == "b":  # [B, ...]: rows only
        return PartitionSpec(rows)
    return PartitionSpec()


def token_spec() -> PartitionSpec:
    """The current mesh's spec of ``[B, T, ...]`` arrays."""
    return _spec("t", tuple(_mesh_sizes()))


def field_sharding(mesh: jax.sharding.Mesh | None, per_token: bool) -> Any:
    """The sharding of a batch field: ``[B, T]`` per-token arrays (``per_token``) or ``[B, ...]`` per-row ones."""
    return None if mesh is None else NamedSharding(mesh, _spec("t" if per_token else "b", tuple(mesh.axis_names)))


def _param_spec(path: str, shape: tuple[int, ...], sizes: dict[str, int]) -> PartitionSpec:
    spec: list[Any] = [None] * len(shape)
    expert = sizes.get("expert", 1)
    if expert > 1 and path.split("/")[-1] in ("w_in", "w_out") and len(shape) == 3:
        spec[0] = "expert"
    fsdp = sizes.get("fsdp", 1)
    if fsdp > 1 and len(shape) >= 2:  # norms and sinks are small: whole on every device
        free = [d for d in range(len(shape)) if spec[d] is None and shape[d] % fsdp == 0 and shape[d] >= fsdp]
        if free:
            spec[max(free, key=lambda d: shape[d])] = "fsdp"
    return PartitionSpec(*spec)


def param_shardings(params: Any, mesh: jax.sharding.Mesh | None) -> Any:
    """A pytree of ``NamedSharding`` for ``params`` (``None`` without a mesh)."""
    if mesh is None:
        return jax.tree.map(lambda _: None, params)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))

    def one(path: Any, leaf: Any) -> NamedSharding:
        return NamedSharding(mesh, _param_spec(jax.tree_util.keystr(path, simple=True, separator="/"),
                                               tuple(leaf.shape), sizes))

    return jax.tree_util.tree_map_with_path(one, params)


def gather(w: jax.Array, keep_experts: bool = False) -> jax.Array:
    """``w`` whole on every device (FSDP's all-gather); with ``keep_experts`` dim 0 stays split over ``expert``."""
    if not _mesh_sizes():
        return w
    spec: tuple[Any, ...] = ()
    if keep_experts and expert_axis() is not None:
        spec = ("expert",)
    if jax.typeof(w).sharding.spec == PartitionSpec(*spec):
        return w
    out: jax.Array = jax.sharding.reshard(w, PartitionSpec(*spec))
    return out


def take_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """``table[ids]`` (an embedding lookup), the output split like ``ids``."""
    if not _mesh_sizes():
        return table[ids]
    spec = PartitionSpec(*jax.typeof(ids).sharding.spec, None)
    return table.at[ids].get(out_sharding=spec)  # explicit axes: the gather's output sharding is not inferred


def per_device(fn: Callable[..., Any], kinds: str) -> Callable[..., Any]:
    """``fn`` run by each device on its part of the batch, inside ``jax.shard_map``: argument ``i`` is split
    as ``kinds[i]`` says — ``t`` ``[B, T, ...]`` by rows and tokens, ``b`` ``[B, ...]`` by rows, ``r`` whole
    (replicated) — and the outputs as ``t``. Outside a mesh ``fn`` itself."""
    names = tuple(_mesh_sizes())
    if not names:
        return fn
    specs = tuple(_spec(kind, names) for kind in kinds)
    return jax.shard_map(fn, in_specs=specs, out_specs=_spec("t", names))
