"""The eager fast path of the public operations: an identical call goes straight to its jitted function.

A public op called outside ``jax.jit`` validates its arguments, looks at their shardings, asks the
Executor (which keys the call, asks the chooser whether its decision holds, binds the kernel) and
then runs a cached jitted function. This module remembers, per call signature, the Executor's
fast-path entry of the last full call, and runs its function directly while its decision holds —
at two levels:

- :func:`run_op` (every op): keyed by the validated call — each concrete array's abstract value
  (shape, dtype, weak type) and, unless it lies on one device, its sharding; the static arguments,
  ``platform``, ``cfg`` — it skips the sharding look-up and the Executor's dispatch;
- :func:`eager_fast_path`, the decorator of every built-in op's public function: keyed by the raw
  arguments — arrays as above, each other value with its type (plain values: numbers, strings,
  tuples, dtypes, classes, enum members, attrs configs) — and the JAX settings validation reads
  (``jax_default_matmul_precision``, dtype promotion, x64), it skips the validation of shapes,
  dtypes and static arguments too, runs the op's checks of array values (``values=``) unless the
  arrays are those already checked, and either the kernel's jitted function or, for a function
  doing more (array work of its own, an output dropped), the whole function jitted once (its
  decisions captured while tracing it).

Whether a decision holds is asked of the chooser (the Executor's entry's ``still_valid()``: registry,
caches, overlays, policy, hooks, the persistent file; it also reports the reuse) once, then not
again while nothing it depends on changed: ejk's epoch (:mod:`ejk._epoch`, bumped by every change
ejk makes to them), the context's Executor and overlay stack, ``EJK_AUTOTUNE`` and, for a decision
taken on a miss, the time until the persistent file is to be looked at again (another process may
write it; the cache directory's variables are read with it). A decision whose check may change
otherwise (a chooser or a kernel selection state of its own) or reports something (``on_event``,
the ``ejk.selection`` debug log) is asked on every call (see :meth:`ejk.config.selection.Reuse.settled`).

Both keys include ``EJKERNEL_OPS_STAMP``. Only concrete arrays take them (under a trace the cost does
not recur), not while calls are recorded (``EJKERNEL_OPS_RECORD``: the Executor records every call),
and not for calls that ran sharded.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np

from ejk import environment
from ejk._epoch import EPOCH
from ejk.config.cache import active_overlays
from ejk.config.selection import logger as selection_log
from ejk.execution.executor import _fast_token

__all__ = ["eager_fast_path", "eager_key", "remember", "run_eager"]

F = TypeVar("F", bound=Callable[..., Any])
_SIZE = 4096
#: a validated call's key -> its :class:`_Decisions`; a raw call's key -> its :class:`_Raw`
_MEMO: dict[Any, Any] = {}
_ArrayImpl: type | None = None
_UNTRACEABLE: set[Any] = set()  # raw calls whose whole function failed to trace: they stay on the full path
_pending = threading.local()
_SINGLE_DEVICE = jax.sharding.SingleDeviceSharding
_stamp_env = environment.raw_reader(environment.EJKERNEL_OPS_STAMP)
_record_env = environment.raw_reader(environment.EJKERNEL_OPS_RECORD)
_autotune_env = environment.raw_reader(environment.EJK_AUTOTUNE)
#: What validation reads besides the arguments (``precision=None``, dtype promotion, x64): JAX's settings
_precision, _promotion, _x64 = jax.default_matmul_precision, jax.numpy_dtype_promotion, jax.enable_x64
_UNSTAMPED = (-1, None, None, None, 0.0)  # matches no call: the decisions are asked first
#: How :func:`_raw_key` keys a value, by its type (memoised by :func:`_kind`; 0: it does not)
_ARRAY, _PLAIN, _FLOAT, _TUPLE = 1, 2, 3, 4
_KINDS: dict[type, int] = {}


def _array_type() -> type:
    """The type of JAX's concrete arrays (made outside any trace: inside one ``jnp.zeros`` is a tracer)."""
    global _ArrayImpl
    if _ArrayImpl is None:
        with jax.ensure_compile_time_eval():
            found = type(jax.numpy.zeros(()))
        if issubclass(found, jax.core.Tracer):
            return type(None)  # matches no array: the full path, asked again next time
        _ArrayImpl = found
    return _ArrayImpl


def _array_part(x: Any) -> Any:
    """A concrete array's part of a key: its abstract value (shape, dtype, weak type) and, unless it lies on
    one device (which one changes nothing of the call), its sharding. ``AttributeError``: an array being
    traced (e.g. under an Explicit mesh)."""
    aval, sharding = x.aval, x.sharding
    return aval if type(sharding) is _SINGLE_DEVICE else (aval, sharding)


def _append_array(parts: list[Any], x: Any, array_type: Any) -> bool:
    if x is None:
        parts.append(None)
    elif type(x) is array_type:
        try:
            parts.append(_array_part(x))
        except AttributeError:  # an array being traced: the full path
            return False
    else:
        return False
    return True


def eager_key(kernel: Any, arrays: tuple[Any, ...], static: dict[str, Any], platform: Any, cfg: Any) -> Any:
    """The key of a validated call (``run_op``'s arguments), or ``None`` when it cannot take the fast
    path (a tracer, a host value). It may be unhashable (an unhashable static argument)."""
    array_type = _ArrayImpl or _array_type()
    parts: list[Any] = [id(kernel), platform, _stamp_env()]
    for x in arrays:
        if not _append_array(parts, x, array_type):
            return None
    for name, value in static.items():
        parts.append(name)
        parts.append(_fast_token(value))
    if cfg is not None:
        parts.append(_fast_token(cfg))
    return tuple(parts)


def _kind(cls: type) -> int:
    """How :func:`_raw_key` keys a value of type ``cls`` (once ``_ArrayImpl`` is known; memoised)."""
    kind = _KINDS.get(cls)
    if kind is None:
        if cls is _ArrayImpl:
            kind = _ARRAY
        elif cls is float:
            kind = _FLOAT
        elif cls is tuple:
            kind = _TUPLE
        elif (cls in (bool, int, str, type(None)) or issubclass(cls, (type, enum.Enum, np.dtype))
              or hasattr(cls, "__attrs_attrs__")):  # immutable values, equal when they act alike (attrs: configs)
            kind = _PLAIN
        else:
            kind = 0
        _KINDS[cls] = kind
    return kind


def _raw_key(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The key of a public function's raw call (``None``: the call cannot take the fast path; the key may
    still be unhashable, e.g. a tuple holding an array)."""
    if _ArrayImpl is None and _array_type() is type(None):
        return None
    parts: list[Any] = [kernel, _stamp_env(), _precision.value, _promotion.value, _x64.value]
    append = parts.append
    for value in (*args, *kwargs.values()) if kwargs else args:
        cls = type(value)
        kind = _KINDS.get(cls) or _kind(cls)
        if kind == _ARRAY:  # _array_part, inlined
            try:
                aval, sharding = value.aval, value.sharding
            except AttributeError:  # an array being traced: the full path
                return None
            append(aval if type(sharding) is _SINGLE_DEVICE else (aval, sharding))
        elif kind == _PLAIN:  # two parts: a type, then the value (no array part starts with a type)
            append(cls)
            append(value)
        elif kind == _FLOAT:
            append(cls)
            append(value.hex())  # 0.0 and -0.0 differ; nan equals itself
        elif kind == _TUPLE:
            append(_fast_token(value))
        else:
            return None
    if kwargs:
        append(tuple(kwargs))
    return tuple(parts)


class _Decisions:
    """The decisions behind a remembered call — ``(executor, its fast-path entry)`` pairs — and the
    ``stamp`` under which they were last confirmed: ``(epoch, overlays, executor, EJK_AUTOTUNE,
    until)``."""

    __slots__ = ("decisions", "stamp")

    def __init__(self, decisions: tuple[tuple[Any, Any], ...]) -> None:
        self.decisions = decisions
        self.stamp: tuple[Any, ...] = _UNSTAMPED  # asked at the first reuse: nothing is known of the time between

    def holds(self, current: Callable[[], Any]) -> bool:
        """Whether every decision still holds (``current()``: the Executor in use): at once while nothing
        they depend on changed since they were confirmed, else asked again."""
        stamp = self.stamp
        if (stamp[0] == EPOCH[0] and stamp[1] is active_overlays() and stamp[2] is current()
                and stamp[3] is _autotune_env() and time.monotonic() < stamp[4]
                and not selection_log.isEnabledFor(logging.DEBUG)):
            return True
        return self._confirm(current)

    def _confirm(self, current: Callable[[], Any]) -> bool:
        """Ask each decision's check (it reports the reuse); when all hold, stamp what they were asked
        under, taken before asking (a change meanwhile ends the stamp), for as long as all are settled."""
        epoch, overlays, executor, autotune = EPOCH[0], active_overlays(), current(), _autotune_env()
        settled = math.inf
        for owner, entry in self.decisions:
            check = entry.still_valid
            if owner is not executor or entry.chooser is not executor.chooser or not check():
                return False
            settle = getattr(check, "settled", None)  # the chain's Reuse; any other check is asked every call
            settled = min(settled, 0.0 if settle is None else settle())
        stamped = settled > 0
        self.stamp = (epoch, overlays, executor, autotune, time.monotonic() + settled) if stamped else _UNSTAMPED
        return True


class _Raw(_Decisions):
    """A decorated public function's remembered call: ``fn`` (the kernel's jitted function, or the whole
    public function jitted; ``None``: the whole function is jitted at the next call) takes the raw
    call's values at ``picks`` (``-1``: ``None``) — when ``pad`` is not ``None``, the positional
    arguments as given, then ``pad``."""

    __slots__ = ("checked", "fn", "pad", "picks")

    def __init__(self, decisions: tuple[tuple[Any, Any], ...], fn: Callable[..., Any] | None,
                 picks: tuple[int, ...], n_positional: int, values: tuple[Any, ...]) -> None:
        super().__init__(decisions)
        self.fn, self.picks = fn, picks
        plain = picks[:n_positional] == tuple(range(n_positional)) and set(picks[n_positional:]) <= {-1}
        self.pad = (None,) * (len(picks) - n_positional) if plain else None
        self.checked = _refs(values)

    def values_checked(self, values: tuple[Any, ...]) -> bool:
        """Whether the values of these arrays were checked already: the arrays of the last call whose
        values passed, the same objects (arrays are immutable), in the same places (the key keeps the
        places of arrays)."""
        return all(ref() is values[i] for i, ref in self.checked)


def _refs(values: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    """The positions of the arrays among ``values``, with weak references to them."""
    array_type = _ArrayImpl
    return tuple((i, weakref.ref(v)) for i, v in enumerate(values) if type(v) is array_type)


def run_eager(key: Any, values: Sequence[Any], current: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, output)`` when the validated call of ``key`` (:func:`eager_key`) ran on the fast path;
    else ``(False, None)``: take the full path. ``values``: the call's arrays; ``current()``: the
    Executor the call would use."""
    try:
        found = _MEMO.get(key) if key is not None else None
    except TypeError:  # an unhashable static argument
        return False, None
    if found is None or _record_env() is not None:
        return False, None
    if not found.holds(current):
        _MEMO.pop(key, None)
        return False, None
    executor, entry = found.decisions[0]
    _remember_raw(executor, entry, tuple(values))  # a decorated function's call that led here
    return True, entry.fn(*values)


def remember(key: Any, executor: Any, entry: Any, arrays: tuple[Any, ...]) -> None:
    """Keep ``entry`` (:meth:`ejk.Executor.fast_entry` of the validated call just run on ``arrays``) for
    the calls of ``key``, and for the raw call of a public function decorated with
    :func:`eager_fast_path` that led here, when its arrays are among its raw arguments."""
    captured = getattr(_pending, "captured", None)
    if captured is not None:  # traced inside a whole public function being compiled: its decisions
        captured.append(None if entry is None else (executor, entry))
    if entry is None:
        _pending.call = None
        return
    if len(_MEMO) >= _SIZE:
        _MEMO.clear()  # bounded; the next calls fill it again
    if key is not None:
        try:
            _MEMO[key] = _Decisions(((executor, entry),))
        except TypeError:  # an unhashable static argument: not remembered
            pass
    _remember_raw(executor, entry, arrays)


def _remember_raw(executor: Any, entry: Any, arrays: tuple[Any, ...]) -> None:
    """Keep ``entry`` for the raw call of the decorated public function under way, if any: its
    kernel's function when each of the validated ``arrays`` is one of the raw arguments as given,
    else (arrays converted by the validation, or a function that computes more than the kernel) its
    whole function, jitted at the next call."""
    raw = getattr(_pending, "call", None)
    if raw is None:
        return
    _pending.call = None
    kernel, raw_key, args, kwargs, whole = raw
    if kernel is not entry.kernel:
        return
    values = (*args, *kwargs.values())
    positions = {id(v): i for i, v in enumerate(values)}
    picks = tuple(-1 if x is None else i if i < len(values) and values[i] is x else positions.get(id(x), -2)
                  for i, x in enumerate(arrays))  # an array passed twice: its own place first
    if whole or -2 in picks:  # array work around the kernel, or arrays converted by the validation
        if raw_key not in _UNTRACEABLE:
            _MEMO[raw_key] = _Raw(((executor, entry),), None, (), len(args), values)
    else:
        _MEMO[raw_key] = _Raw(((executor, entry),), entry.fn, picks, len(args), values)


def _jit_whole(function: Callable[..., Any], values: tuple[Any, ...], names: tuple[str, ...],
               array_type: Any) -> tuple[Callable[..., Any], tuple[int, ...]]:
    """``function`` jitted over the arrays of the raw call ``values`` (the other values, whose keyword
    ``names`` are the last ones, baked in), and the arrays' positions among ``values``."""
    positions = tuple(i for i, v in enumerate(values) if type(v) is array_type)
    fixed = tuple(None if i in positions else v for i, v in enumerate(values))  # holds no array
    n_positional = len(values) - len(names)

    def whole(*arrays: Any) -> Any:
        given = list(fixed)
        for i, x in zip(positions, arrays, strict=True):
            given[i] = x
        return function(*given[:n_positional], **dict(zip(names, given[n_positional:], strict=True)))

    whole.__name__ = getattr(function, "__name__", "whole")
    return jax.jit(whole), positions


def eager_fast_path(kernel: Any, current: Callable[[], Any], *, values: Callable[..., None] | None = None,
                    whole: bool = False) -> Callable[[F], F]:
    """Decorate the public function of ``kernel``'s op: an eager call identical to an earlier one —
    concrete arrays of the same shapes, dtypes and shardings, equal plain arguments — skips the
    validation of shapes, dtypes and static arguments and runs the jitted function of the earlier call
    while its decision holds (``current()``: the Executor in use).

    Args:
        values: Called with the raw arguments on such a call, before running it: the checks of the
            arrays' values (group sizes, lengths, page tables…), raising the ``ValueError`` the full
            path would; skipped when the arrays are the very objects of the last call checked (arrays
            are immutable). ``None``: the validation reads no value.
        whole: The function does more than return the kernel's output (array work of its own, or
            dropping an output, which under ``jax.jit`` is never computed): from the second identical
            call on, the whole function runs as one jitted function, compiled then (its decisions, taken
            while tracing, checked at every call) — the program ``jax.jit`` of the call runs. Also what
            happens, whatever ``whole``, when the validation converted an argument (an int into an array).
    """
    def decorate(function: F) -> F:
        @functools.wraps(function)
        def public(*args: Any, **kwargs: Any) -> Any:
            key = _raw_key(kernel, args, kwargs)
            try:
                found = _MEMO.get(key) if key is not None else None
            except TypeError:  # an unhashable argument: never remembered
                key = found = None
            if key is None:
                return function(*args, **kwargs)
            if type(found) is _Raw and _record_env() is None:
                if found.holds(current):
                    return _run(found, key, function, values, args, kwargs)
                _MEMO.pop(key, None)
            _pending.call = (kernel, key, args, kwargs, whole)
            try:
                return function(*args, **kwargs)
            finally:
                _pending.call = None

        return public  # type: ignore[return-value]

    return decorate


def _run(found: _Raw, key: Any, function: Callable[..., Any], values: Callable[..., None] | None,
         args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the remembered call ``found`` of ``function`` (its values checked first, unless checked already)."""
    if values is not None:
        given = (*args, *kwargs.values())
        if not found.values_checked(given):
            values(*args, **kwargs)
            found.checked = _refs(given)
    fn, pad = found.fn, found.pad
    if fn is None:
        return _compile_whole(key, function, args, kwargs)
    if pad is not None:
        return fn(*args, *pad)
    given = (*args, *kwargs.values(), None)  # -1 picks the None
    return fn(*[given[i] for i in found.picks])


def _compile_whole(key: Any, function: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    """Run the raw call of ``key`` through its whole function, jitted (and traced) now; remember it when
    every op call of the trace took a decision that the fast path can check."""
    values = (*args, *kwargs.values())
    jitted, positions = _jit_whole(function, values, tuple(kwargs), _ArrayImpl or _array_type())
    _pending.call, _pending.captured = None, []
    try:
        out = jitted(*[values[i] for i in positions])
        captured = _pending.captured
    except Exception:  # the function cannot be traced as called here: it stays eager (the full path)
        _MEMO.pop(key, None)
        if len(_UNTRACEABLE) >= _SIZE:
            _UNTRACEABLE.clear()
        _UNTRACEABLE.add(key)
        return function(*args, **kwargs)
    finally:
        _pending.captured = None
    if captured and None not in captured:
        _MEMO[key] = _Raw(tuple(captured), jitted, positions, len(args), values)
    else:
        _MEMO.pop(key, None)
    return out
