"""The Executor: prepare → Invocation → choose config → (custom VJP) → stamp → run → record.

Config selection happens when the call is traced, so under ``jax.jit`` it costs nothing
at run time. Eager calls run a jitted function cached per (kernel, config, static args).

Fast path: a call identical to an earlier one — same kernel, argument shapes and dtypes, static
keyword arguments, explicit ``cfg=`` and ``EJKERNEL_OPS_STAMP`` — goes straight to the jitted
function bound for it, while the chooser confirms that its decision still holds (see
:meth:`ejk.ConfigSelectorChain.choose_reusable`: overlays, cache puts and clears, a new
persistent entry and plugin hooks all end the reuse). Recording still happens on every call.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import jax

from ejk import environment
from ejk._epoch import bump
from ejk.execution.device import device_fingerprint
from ejk.execution.kernel import Invocation, Kernel, bind_kernel, make_call_key, static_key
from ejk.invocations import record_invocation

__all__ = ["ConfigChooser", "Executor"]

Cfg = TypeVar("Cfg")
Out = TypeVar("Out")
_BOUND_CACHE_SIZE = 512
_CALL_KEY_MEMO_SIZE = 4096
_FAST_PATH_SIZE = 4096
_ARRAY_TYPES: dict[type, bool] = {}


@runtime_checkable
class ConfigChooser(Protocol[Cfg]):
    """Anything that picks a config for an invocation (e.g. :class:`~ejk.ConfigSelectorChain`).

    The Executor only asks it when the call has no explicit ``cfg=``, unless the chooser sets
    ``reports_overrides = True`` (it then sees every call and must return the override).

    Optionally a chooser also implements ``choose_reusable(inv, kernel) -> (cfg, still_valid)``
    (as :meth:`ejk.ConfigSelectorChain.choose_reusable` does): ``still_valid`` (or ``None``)
    is called instead of choosing again on later identical eager calls, and returns ``False``
    once the decision may have changed. A chooser with ``choose`` alone is asked every call.
    The eager fast path of the public ops calls ``still_valid`` on every call too, unless it has a
    ``settled()`` method (as :class:`ejk.config.selection.Reuse` has): then only when ejk's epoch
    (:mod:`ejk._epoch`) or the context changed, or the seconds ``settled()`` gave passed.
    """

    def choose(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> Cfg: ...


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A cheap hashable signature used to memoise call keys (``None`` if unhashable)."""
    leaves, treedef = jax.tree.flatten(args, is_leaf=lambda x: x is None)
    parts = tuple((x.shape, x.dtype) if hasattr(x, "dtype") and hasattr(x, "shape") else (type(x), x)
                  for x in leaves)
    try:  # values with their types: 1, 1.0 and True are equal and hash alike, but key differently
        sig = (treedef, parts, tuple(sorted((k, _typed(v)) for k, v in kwargs.items())))
        hash(sig)
    except TypeError:
        return None
    return sig


def _is_array_type(cls: type) -> bool:
    """Whether arguments of type ``cls`` are array leaves (arrays, tracers, NumPy values); memoised."""
    known = _ARRAY_TYPES.get(cls)
    if known is None:
        import numpy as np

        known = _ARRAY_TYPES[cls] = issubclass(cls, (jax.Array, jax.core.Tracer, np.ndarray, np.generic))
    return known


_KWARGS = object()
_CFG = object()


def _fast_token(value: Any) -> Any:
    """A type-exact key of a static value: ``1``, ``1.0``, ``True`` differ, as do ``0.0`` and ``-0.0``."""
    cls = type(value)
    if cls is float:
        return (cls, value.hex())
    if cls is tuple or cls is list:
        return (cls, tuple(_fast_token(v) for v in value))
    return (cls, value)


class _FastEntry:
    """What an earlier identical call decided: reused while ``still_valid()`` says so."""

    __slots__ = ("call_key", "chooser", "device", "fn", "implementation", "kernel", "op_id_v", "still_valid")

    def __init__(self, kernel: Any, chooser: Any, still_valid: Callable[[], bool], fn: Callable[..., Any],
                 device: str, op_id_v: str, call_key: str, implementation: str | None) -> None:
        self.kernel, self.chooser, self.still_valid, self.fn = kernel, chooser, still_valid, fn
        self.device, self.op_id_v, self.call_key = device, op_id_v, call_key
        self.implementation = implementation


class _Keyed:
    """A ``functools.lru_cache`` argument that hashes and compares by ``key`` (tokens of possibly
    unhashable configs) and carries the originals the build needs in ``payload``."""

    __slots__ = ("key", "payload")

    def __init__(self, key: Any, payload: Any) -> None:
        self.key, self.payload = key, payload

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and self.key == other.key


def _always() -> bool:
    return True


def _typed(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_typed(v) for v in value))
    return (type(value), value)


def _token(value: Any) -> Any:
    """A hashable, type-aware stand-in for a config or static argument (bound-function cache key)."""
    typed = _typed(value)
    try:
        hash(typed)
        return typed
    except TypeError:
        return json.dumps(static_key(value, where="cfg"), sort_keys=True)


class Executor(Generic[Cfg, Out]):
    """Runs kernels with chosen configs.

    Args:
        chooser: Picks configs (typically a :class:`~ejk.ConfigSelectorChain`).
        stamp_prefix: Prefix of the profiler names given to kernel calls.
        device: Device whose fingerprint keys the caches (default: JAX's first device).
        jit: Run eager calls through a cached ``jax.jit`` of the bound kernel.
    """

    def __init__(self, chooser: ConfigChooser[Cfg], stamp_prefix: str = "ejk_ops", *, device: Any = None,
                 jit: bool = True) -> None:
        self.chooser = chooser
        self.stamp_prefix = stamp_prefix
        self.device = device
        self.jit = jit
        self._keys: dict[Any, str] = {}
        self._device_fingerprint: str | None = None
        self._bound = functools.lru_cache(maxsize=_BOUND_CACHE_SIZE)(self._build_keyed)
        self._fast: dict[Any, _FastEntry] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        bump()  # e.g. another chooser: a reused decision is its old chooser's

    # -- building blocks -----------------------------------------------------------------------

    def invocation(self, kernel: Kernel[Cfg, Out], args: tuple[Any, ...], kwargs: dict[str, Any],
                   cfg: Cfg | None = None, batch_axes: Any = None) -> Invocation[Cfg]:
        """The :class:`Invocation` of already-prepared arguments."""
        op_id_v = f"{kernel.op_id}@{kernel.version}"
        sig = _signature(args, kwargs)
        memo = (op_id_v, sig, batch_axes) if sig is not None else None
        call_key = self._keys.get(memo) if memo is not None else None
        if call_key is None:
            call_key = make_call_key(op_id_v, args, kwargs, batch_axes)
            if memo is not None:
                if len(self._keys) >= _CALL_KEY_MEMO_SIZE:
                    self._keys.clear()  # a bounded memo: rebuilding a key is cheap
                self._keys[memo] = call_key
        return Invocation(op_id=kernel.op_id, version=kernel.version, args=args, kwargs=kwargs,
                          call_key=call_key, device=self.device_fingerprint(), override_cfg=cfg,
                          batch_axes=batch_axes)

    def device_fingerprint(self) -> str:
        """The fingerprint keying this Executor's configs (computed once): the kind of device,
        without plugins' facts — a kernel that dispatches to implementations keys each cached
        entry by the facts of its own platform (see :meth:`ejk.ops.OpKernel.cfg_from_json`)."""
        if self._device_fingerprint is None:
            self._device_fingerprint = device_fingerprint(self.device, plugin_facts=False)
        return self._device_fingerprint

    def _stamp(self, inv: Invocation[Cfg], mode: str) -> str | None:
        if mode == "none":
            return None
        if mode == "json":
            payload = {"op": inv.op_id_v, "call_key": inv.call_key,
                       "kwargs": static_key(dict(inv.kwargs), where="keyword argument")}
            return f"{self.stamp_prefix}#{json.dumps(payload, sort_keys=True, separators=(',', ':'))}"
        return f"{self.stamp_prefix}#{inv.op_id}#{inv.call_key[:16]}"

    def bind(self, kernel: Kernel[Cfg, Out], cfg: Cfg, kwargs: dict[str, Any],
             stamp: str | None = None) -> Callable[..., Out]:
        """``f(*args)`` running ``kernel`` with ``cfg`` — with its custom VJP when it defines one."""
        key = (id(kernel), _token(cfg), tuple(sorted((k, _token(v)) for k, v in kwargs.items())), stamp)
        return self._bound(_Keyed(key, (kernel, cfg, kwargs, stamp)))

    def _build_keyed(self, keyed: _Keyed) -> Callable[..., Any]:
        return self._build(*keyed.payload)

    def _build(self, kernel: Kernel[Cfg, Out], cfg: Cfg, kwargs: dict[str, Any],
               stamp: str | None) -> Callable[..., Out]:
        body = bind_kernel(kernel, cfg, kwargs)

        def stamped(*args: Any) -> Out:
            if stamp is None:
                return body(*args)
            with jax.named_scope(stamp):
                return body(*args)

        stamped.__name__ = f"{kernel.op_id}"
        # inline=True: traced inside a caller's jit the kernel is inlined rather than kept as a nested
        # call (jax 0.11.2's Shardy pass segfaulted on GPUs on a nested call inside a shard_map body
        # whose results held a zero-size residual, e.g. cuDNN attention's); eager calls are unchanged.
        return jax.jit(stamped, inline=True) if self.jit else stamped

    # -- public API -----------------------------------------------------------------------------

    def _choose(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Out], cfg: Cfg | None) -> Cfg:
        if cfg is None:
            return self.chooser.choose(inv, kernel)
        if getattr(self.chooser, "reports_overrides", False):
            self.chooser.choose(inv, kernel)  # lets the chooser record the override (an event)
        return cfg  # an explicit cfg always wins, whatever the chooser does

    def choose_config(self, kernel: Kernel[Cfg, Out], *args: Any, cfg: Cfg | None = None, **kwargs: Any) -> Cfg:
        """The config a call with these arguments would use (without running it)."""
        args, kwargs = kernel.prepare(*args, **kwargs)
        return self._choose(self.invocation(kernel, args, kwargs, cfg), kernel, cfg)

    def __call__(self, kernel: Kernel[Cfg, Out], *args: Any, cfg: Cfg | None = None, **kwargs: Any) -> Out:
        """Run ``kernel``: an explicit ``cfg`` always wins; otherwise the chooser decides."""
        args, kwargs = kernel.prepare(*args, **kwargs)
        key = self._fast_key(kernel, args, kwargs, cfg)
        if key is not None:
            try:
                entry = self._fast.get(key)
            except TypeError:  # an unhashable static argument: the full path
                entry = key = None
            if entry is not None and entry.kernel is kernel and entry.chooser is self.chooser and entry.still_valid():
                if environment.raw(environment.EJKERNEL_OPS_RECORD) is not None and environment.record_enabled():
                    record_invocation(entry.device, entry.op_id_v, entry.call_key, kernel, args, kwargs,
                                      entry.implementation)
                return entry.fn(*args)  # type: ignore[no-any-return]
        chooser = self.chooser
        inv = self.invocation(kernel, args, kwargs, cfg)
        chosen, still_valid = self._choose_reusable(inv, kernel, cfg)
        if environment.record_enabled():
            record_invocation(inv.device, inv.op_id_v, inv.call_key, kernel, args, kwargs, kernel.cfg_label(chosen))
        fn = self.bind(kernel, kernel.complete_cfg(inv, chosen), kwargs, self._stamp(inv, environment.stamp_mode()))
        if key is not None and still_valid is not None and key[1] == environment.raw(environment.EJKERNEL_OPS_STAMP):
            if len(self._fast) >= _FAST_PATH_SIZE:
                self._fast.clear()  # bounded; rebuilt by the next calls
            self._fast[key] = _FastEntry(kernel, chooser, still_valid, fn, inv.device, inv.op_id_v, inv.call_key,
                                         kernel.cfg_label(chosen))
        return fn(*args)

    def fast_entry(self, kernel: Kernel[Cfg, Out], *args: Any, cfg: Cfg | None = None,
                   **kwargs: Any) -> _FastEntry | None:
        """The fast path's entry of a call (as :meth:`__call__` takes it) when an earlier identical call
        left one (``None``: the next identical call takes the full path). Its ``fn`` runs the call while
        its ``still_valid()`` holds, for this Executor's current ``chooser`` (``entry.chooser``)."""
        args, kwargs = kernel.prepare(*args, **kwargs)
        key = self._fast_key(kernel, args, kwargs, cfg)
        try:
            entry = None if key is None else self._fast.get(key)
        except TypeError:
            return None
        return entry if entry is not None and entry.kernel is kernel else None

    def _fast_key(self, kernel: Kernel[Cfg, Out], args: tuple[Any, ...], kwargs: dict[str, Any],
                  cfg: Cfg | None) -> Any:
        """The fast path's key of a call: the kernel, each argument's shape and dtype, the static
        keyword arguments (type-exact), the explicit ``cfg``, ``EJKERNEL_OPS_STAMP`` and what
        else shapes the bound function (``stamp_prefix``, ``jit``). ``None``
        when an argument is not an array (or tracer) or ``None`` — pytrees and Python scalars take
        the full path. The key may still be unhashable (the caller then takes the full path)."""
        parts: list[Any] = [id(kernel), environment.raw(environment.EJKERNEL_OPS_STAMP), self.stamp_prefix, self.jit]
        append = parts.append
        for x in args:
            if x is None:
                append(None)
                continue
            cls = type(x)
            known = _ARRAY_TYPES.get(cls)
            if known is None:
                known = _is_array_type(cls)
            if not known:
                return None
            try:
                append(x.shape)
                append(x.dtype)
            except AttributeError:  # a tracer of something other than an array (a token)
                return None
        append(_KWARGS)  # neither None, a shape nor a dtype: separates the arguments from the rest
        for name, value in kwargs.items():
            cls = type(value)
            append(name)
            append(cls)
            append(value if cls is not float and cls is not tuple and cls is not list else _fast_token(value))
        if cfg is not None:
            append(_CFG)
            append(_fast_token(cfg))
        return tuple(parts)

    def _choose_reusable(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Out],
                         cfg: Cfg | None) -> tuple[Cfg, Callable[[], bool] | None]:
        """The config and, when the chooser can vouch for it, a check that the decision still holds."""
        reusable = getattr(self.chooser, "choose_reusable", None)
        if cfg is None:
            if reusable is None:
                return self.chooser.choose(inv, kernel), None
            return reusable(inv, kernel)  # type: ignore[no-any-return]
        if getattr(self.chooser, "reports_overrides", False):
            if reusable is None:
                self.chooser.choose(inv, kernel)
                return cfg, None
            return cfg, reusable(inv, kernel)[1]  # an explicit cfg always wins, whatever the chooser does
        return cfg, _always

    def compile(self, kernel: Kernel[Cfg, Out], *example_args: Any, cfg: Cfg | None = None,
                **example_kwargs: Any) -> Callable[..., Out]:
        """Choose a config for the example arguments and compile the kernel with it.

        Returns a function taking the same arguments as the example (same shapes and
        dtypes, same static keyword arguments) that runs the compiled executable.
        """
        args, kwargs = kernel.prepare(*example_args, **example_kwargs)
        inv = self.invocation(kernel, args, kwargs, cfg)
        chosen = kernel.complete_cfg(inv, self._choose(inv, kernel, cfg))
        fn = self.bind(kernel, chosen, kwargs, self._stamp(inv, environment.stamp_mode()))
        compiled = jax.jit(fn).lower(*args).compile()  # jit of a jitted function adds nothing

        def call(*call_args: Any, **call_kwargs: Any) -> Out:
            new_args, new_kwargs = kernel.prepare(*call_args, **call_kwargs)
            if static_key(new_kwargs, where="keyword argument") != static_key(kwargs, where="keyword argument"):
                raise ValueError(
                    f"{kernel.op_id}: compiled for keyword arguments {kwargs!r} but called with {new_kwargs!r}; "
                    "compile again for other static arguments"
                )
            return compiled(*new_args)  # type: ignore[no-any-return]

        call.config = chosen  # type: ignore[attr-defined]
        call.compiled = compiled  # type: ignore[attr-defined]
        return call
