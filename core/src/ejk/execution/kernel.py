"""The :class:`Kernel` interface and :class:`Invocation`, with its stable ``call_key``.

Convention: a kernel's positional arguments are the (pytrees of) arrays it computes on —
these are what custom VJPs differentiate — and its keyword arguments are static Python
values (ints, floats, strings, tuples, enums, dtypes, attrs/dataclass instances) that are
part of the call signature.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs
import jax
import numpy as np

from ejk.config.serialization import from_jsonable, to_jsonable

__all__ = ["Invocation", "Kernel", "abstract_args", "bind_kernel", "make_call_key", "static_key"]

Cfg = TypeVar("Cfg")
Out = TypeVar("Out")
F = TypeVar("F", bound=Callable[..., Any])
_TRACKED_STATES: set[Callable[..., Any]] = set()


def tracked_state(method: F) -> F:
    """Mark an implementation of :meth:`Kernel.selection_state` whose every change bumps ejk's epoch
    (:mod:`ejk._epoch`): the eager fast path reuses its decisions without asking it each call."""
    _TRACKED_STATES.add(method)
    return method


def state_tracked(kernel: Any) -> bool:
    """Whether ``kernel.selection_state()`` changes only with ejk's epoch (see :func:`tracked_state`)."""
    return type(kernel).selection_state in _TRACKED_STATES


def _is_array(leaf: Any) -> bool:
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


def _abstract(leaf: Any) -> Any:
    if _is_array(leaf):
        return jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype),
                                    weak_type=bool(getattr(leaf, "weak_type", False)))
    return leaf


def abstract_args(tree: Any) -> Any:
    """``tree`` with every array leaf (tracers included) replaced by a ``jax.ShapeDtypeStruct``."""
    return jax.tree.map(_abstract, tree)


def static_key(value: Any, *, where: str = "argument") -> Any:
    """A JSON-able canonical form of a static value, stable across processes.

    Raises:
        TypeError: for values whose only description would be a memory address.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}", "value": static_key(value.value)}
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return repr(value) if not math.isfinite(value) else value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return static_key(value.item(), where=where)
    if isinstance(value, (np.dtype, type)) and (isinstance(value, np.dtype) or issubclass(value, np.generic)):
        return {"dtype": np.dtype(value).name}
    if _is_array(value):
        return {"array": list(value.shape), "dtype": np.dtype(value.dtype).name}
    if isinstance(value, (tuple, list)):
        return [static_key(v, where=where) for v in value]
    if isinstance(value, Mapping):
        return {str(k): static_key(v, where=where) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if attrs.has(type(value)):
        return {"class": f"{type(value).__module__}.{type(value).__qualname__}",
                "fields": static_key(attrs.asdict(value, recurse=False), where=where)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"class": f"{type(value).__module__}.{type(value).__qualname__}",
                "fields": static_key({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, where=where)}
    if callable(value) and hasattr(value, "__qualname__"):
        return {"callable": f"{getattr(value, '__module__', '?')}.{value.__qualname__}"}
    raise TypeError(
        f"{where} of type {type(value).__name__} cannot be part of a stable cache key; pass ints, floats, "
        "strings, tuples, enums, dtypes or attrs/dataclass instances as static keyword arguments"
    )


def _describe_leaf(leaf: Any) -> Any:
    if _is_array(leaf):
        return [list(leaf.shape), np.dtype(leaf.dtype).name]
    if isinstance(leaf, (bool, int, float, complex)):
        return ["python", type(leaf).__name__]
    return static_key(leaf, where="positional argument")


def make_call_key(op_id_v: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                  batch_axes: Any = None) -> str:
    """A stable hash of the abstract call signature.

    Covers the op id and version, the pytree structure, each array leaf's shape and dtype
    *name*, the static keyword arguments and the batch axes. Equal signatures give equal
    keys in every process; no memory address or file path enters the key.
    """
    leaves, treedef = jax.tree.flatten(tuple(args), is_leaf=lambda x: x is None)
    payload = {
        "op": op_id_v,
        "tree": str(treedef),
        "args": [_describe_leaf(leaf) for leaf in leaves],
        "kwargs": static_key(dict(kwargs), where="keyword argument"),
        "batch_axes": static_key(batch_axes, where="batch_axes"),
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@attrs.frozen(kw_only=True)
class Invocation(Generic[Cfg]):
    """One call of a kernel: its arguments and the key its config is cached under.

    Attributes:
        op_id: Kernel op id; ``op_id_v`` adds the version.
        args: Positional (array) arguments — concrete arrays or tracers at trace time.
        kwargs: Static keyword arguments.
        call_key: Stable hash of the abstract signature (see :func:`make_call_key`).
        device: Device fingerprint the config is chosen for.
        override_cfg: The explicit ``cfg=`` of the call, if any.
        batch_axes: vmap batch axes, when the caller knows them.
    """

    op_id: str
    version: str
    args: tuple[Any, ...] = attrs.field(eq=False)
    kwargs: Mapping[str, Any] = attrs.field(eq=False, factory=dict)
    call_key: str
    device: str
    override_cfg: Cfg | None = attrs.field(default=None, eq=False)
    batch_axes: Any = None

    @property
    def op_id_v(self) -> str:
        return f"{self.op_id}@{self.version}"

    @property
    def cache_key(self) -> tuple[str, str, str]:
        """``(device, op_id@version, call_key)`` — the key of every config cache."""
        return (self.device, self.op_id_v, self.call_key)

    @property
    def abstract_args(self) -> tuple[Any, ...]:
        """The positional arguments with array leaves as ``jax.ShapeDtypeStruct``."""
        return abstract_args(self.args)  # type: ignore[no-any-return]

    def describe(self) -> str:
        """``op@v(4x4096x16x128:bfloat16, ..., causal=True)`` — the call, for messages."""
        def leaf(x: Any) -> str:
            if _is_array(x):
                return f"{'x'.join(map(str, x.shape)) or 'scalar'}:{np.dtype(x.dtype).name}"
            return repr(x)

        parts = [leaf(x) for x in jax.tree.leaves(self.args, is_leaf=lambda x: x is None) if x is not None]
        parts += [f"{k}={v!r}" for k, v in sorted(self.kwargs.items())]
        return f"{self.op_id_v}({', '.join(parts)})"


class Kernel(Generic[Cfg, Out]):
    """A kernel the :class:`~ejk.Executor` can configure, run and differentiate.

    Subclasses set ``op_id`` and ``version`` and implement :meth:`run`; they may implement
    :meth:`heuristic_cfg`, :meth:`candidate_cfgs` (for autotuning), :meth:`prepare`, and
    :meth:`fwd` plus :meth:`bwd` for a custom VJP.

    Custom VJP convention: ``fwd(*args, cfg=..., **kwargs) -> (out, residuals)`` and
    ``bwd(residuals, cotangent, cfg=..., **kwargs) -> tuple`` with one cotangent per
    positional argument (``None`` for a non-differentiable one). Keyword arguments are
    static and never differentiated.
    """

    op_id: str = "kernel"
    version: str = "1"
    #: Config class for rebuilding persisted configs (attrs, dataclass or pydantic).
    cfg_type: type | None = None

    def prepare(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Normalise the call's arguments before anything else (default: unchanged)."""
        return args, kwargs

    def run(self, *args: Any, cfg: Cfg, **kwargs: Any) -> Out:
        """Compute the output with config ``cfg``."""
        raise NotImplementedError(f"{type(self).__name__}.run is not implemented")

    def heuristic_cfg(self, inv: Invocation[Cfg]) -> Cfg | None:
        """A config chosen without measuring, or ``None`` when the kernel has none."""
        return None

    def candidate_cfgs(self, inv: Invocation[Cfg]) -> Sequence[Cfg]:
        """Configs the autotuner may compare (empty: no autotuning)."""
        return ()

    def prune_reason(self, inv: Invocation[Cfg], cfg: Cfg) -> str | None:
        """Why candidate ``cfg`` is unfit for ``inv``, decided before compiling it (``None``: fit).

        The autotuner never compiles a candidate with a reason (for example "block_q 256 >
        sequence length 64" or "needs 300 KiB of shared memory"); it reports it as pruned.
        """
        return None

    def override_problem(self, cfg: Any) -> str | None:
        """What an ``ejk_choose_config`` hook's config for this kernel must be, when ``cfg`` is not
        that (``None``: accepted, the default); the plugin host refuses an override with a problem."""
        return None

    def complete_cfg(self, inv: Invocation[Cfg], cfg: Cfg) -> Cfg:
        """The config a call runs with: ``cfg`` with what it leaves open decided for ``inv`` (the
        Executor calls it on every chosen or explicit config before binding; default: ``cfg``)."""
        return cfg

    def fwd(self, *args: Any, cfg: Cfg, **kwargs: Any) -> tuple[Out, Any]:
        """Forward pass of a custom VJP: ``(out, residuals)``. Optional."""
        raise NotImplementedError

    def bwd(self, residuals: Any, cotangent: Any, *, cfg: Cfg, **kwargs: Any) -> tuple[Any, ...]:
        """Backward pass of a custom VJP: one cotangent per positional argument. Optional."""
        raise NotImplementedError

    @property
    def has_custom_vjp(self) -> bool:
        """Whether the subclass defines both :meth:`fwd` and :meth:`bwd`."""
        cls = type(self)
        return cls.fwd is not Kernel.fwd and cls.bwd is not Kernel.bwd

    def uses_custom_vjp(self, cfg: Cfg) -> bool:
        """Whether running with ``cfg`` goes through :meth:`fwd` / :meth:`bwd` (default:
        :attr:`has_custom_vjp`; kernels that dispatch to implementations decide per config)."""
        return self.has_custom_vjp

    def unusable_reason(self, inv: Invocation[Cfg], cfg: Cfg) -> str | None:
        """Why ``cfg`` cannot run ``inv`` here, or ``None`` when it can.

        The selection chain skips cached, overlaid and hook-provided configs with a reason, and
        rejects an explicit ``cfg=`` with one (``ValueError``). Default: every config can.
        """
        return None

    @tracked_state
    def selection_state(self) -> Any:
        """A value that changes whenever this kernel's answers to selection may change (which
        configs are usable, its heuristics): a decision is reused only while it is equal.
        Default ``None``: the answers depend on the invocation alone. An override is asked on
        every reuse, unless decorated with :func:`tracked_state`."""
        return None

    def cfg_label(self, cfg: Cfg) -> str | None:
        """Which implementation ``cfg`` selects, for grouping tuning results (``None``: one)."""
        return None

    def tuning_args(self, inv: Invocation[Cfg], seed: int = 0) -> tuple[Any, ...]:
        """Representative random inputs with the invocation's shapes, for autotuning.

        The default draws floats from a standard normal and fills integers with zeros and
        booleans with ``True``; kernels whose integer inputs carry meaning (lengths, page
        tables, group sizes) override this with realistic values.
        """
        rng = np.random.default_rng(seed)

        def sample(leaf: Any) -> Any:
            if not _is_array(leaf):
                return leaf
            dtype = np.dtype(leaf.dtype)
            if np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16":
                return jax.numpy.asarray(rng.standard_normal(leaf.shape, dtype=np.float32), dtype=dtype)
            if dtype == np.bool_:
                return jax.numpy.ones(leaf.shape, dtype)
            return jax.numpy.zeros(leaf.shape, dtype)

        return tuple(jax.tree.map(sample, inv.abstract_args))

    def cfg_to_json(self, cfg: Cfg) -> Any:
        """Serialise a config for the persistent cache."""
        return to_jsonable(cfg)

    def cfg_from_json(self, data: Any) -> Cfg:
        """Rebuild a config from :meth:`cfg_to_json` output (raise if it no longer fits)."""
        return from_jsonable(data, cfg_type=self.cfg_type)  # type: ignore[no-any-return]

    def cfg_versions(self, cfg: Cfg) -> Mapping[str, str]:
        """Distribution versions ``cfg`` depends on (recorded as provenance; a change makes it stale)."""
        return {}

    def describe_cfg(self, cfg: Cfg) -> str:
        """A short human-readable form of ``cfg`` for events and the CLI."""
        return repr(cfg)


def bind_kernel(kernel: Kernel[Cfg, Out], cfg: Cfg, kwargs: Mapping[str, Any]) -> Callable[..., Out]:
    """``f(*args) = kernel.run(*args, cfg=cfg, **kwargs)``, with the kernel's custom VJP if it has one."""
    static = dict(kwargs)

    def run(*args: Any) -> Out:
        return kernel.run(*args, cfg=cfg, **static)

    if not kernel.uses_custom_vjp(cfg):
        return run
    with_vjp = jax.custom_vjp(run)

    def fwd(*args: Any) -> tuple[Out, Any]:
        return kernel.fwd(*args, cfg=cfg, **static)

    def bwd(residuals: Any, cotangent: Any) -> tuple[Any, ...]:
        return tuple(kernel.bwd(residuals, cotangent, cfg=cfg, **static))

    with_vjp.defvjp(fwd, bwd)
    return with_vjp
