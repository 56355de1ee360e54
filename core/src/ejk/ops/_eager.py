"""The eager fast path of the public operations: an identical call goes straight to its jitted function.

A public op called outside ``jax.jit`` validates its arguments, looks at their shardings, asks the
Executor (which keys the call, asks the chooser whether its decision holds, binds the kernel) and
then runs a cached jitted function. This module remembers, per call signature, the Executor's
fast-path entry of the last full call, and runs its function directly while that Executor is still the
current one, its chooser unchanged, and the entry's ``still_valid()`` holds (the chooser's own check:
registry, caches, overlays, policy, hooks, the persistent file) — at two levels:

- :func:`run_op` (every op): keyed by the validated call — each array's type, shape, dtype and
  sharding, the static arguments, ``platform``, ``cfg`` — it skips the sharding look-up and the
  Executor's dispatch;
- :func:`eager_fast_path`, the decorator of every built-in op's public function: keyed by the raw
  arguments and the JAX settings validation reads (``jax_default_matmul_precision``, dtype promotion,
  x64), it skips the validation of shapes, dtypes and static arguments too, runs the op's checks of
  array values (``values=``) unless the arrays are those already checked, and either the kernel's
  jitted function or, for a function doing more (array work of its own, an output dropped), the whole
  function jitted once (its decisions captured while tracing it).

Both include ``EJKERNEL_OPS_STAMP``. Only concrete arrays take them (under a trace the cost does not
recur), not while calls are recorded (``EJKERNEL_OPS_RECORD``: the Executor records every call), and
not for calls that ran sharded.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax

from ejk import environment
from ejk.execution.executor import _fast_token

__all__ = ["eager_fast_path", "eager_key", "remember", "run_eager"]

F = TypeVar("F", bound=Callable[..., Any])
_SIZE = 4096
#: a validated call's key -> (executor, its fast-path entry, None); a raw call's key -> its :class:`_Raw`
_MEMO: dict[Any, Any] = {}
_ArrayImpl: type | None = None
_UNTRACEABLE: set[Any] = set()  # raw calls whose whole function failed to trace: they stay on the full path
_SCALARS = (bool, int, float, str, type(None))
_pending = threading.local()


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


def _append_array(parts: list[Any], x: Any, array_type: Any) -> bool:
    if x is None:
        parts.append(None)
    elif type(x) is array_type:
        try:
            sharding = x.sharding
        except AttributeError:  # an array being traced (e.g. under an Explicit mesh): the full path
            return False
        parts.append(x.shape)
        parts.append(x.dtype)
        parts.append(sharding)
    else:
        return False
    return True


def _hashable(parts: list[Any]) -> Any:
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def eager_key(kernel: Any, arrays: tuple[Any, ...], static: dict[str, Any], platform: Any, cfg: Any) -> Any:
    """The key of a validated call (``run_op``'s arguments), or ``None`` when it cannot take the fast
    path (a tracer, a host value, an unhashable argument)."""
    array_type = _ArrayImpl or _array_type()
    parts: list[Any] = [id(kernel), platform, environment.raw(environment.EJKERNEL_OPS_STAMP)]
    for x in arrays:
        if not _append_array(parts, x, array_type):
            return None
    for name, value in static.items():
        parts.append(name)
        parts.append(_fast_token(value))
    if cfg is not None:
        parts.append(_fast_token(cfg))
    return _hashable(parts)


def _raw_key(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The key of a public function's raw call: its arrays (concrete only) and plain Python values."""
    array_type = _ArrayImpl or _array_type()
    config = jax.config  # what validation reads besides the arguments (precision=None, dtype promotion, x64)
    parts: list[Any] = ["raw", id(kernel), environment.raw(environment.EJKERNEL_OPS_STAMP),
                        config.jax_default_matmul_precision, config.jax_numpy_dtype_promotion,  # type: ignore[attr-defined]
                        config.jax_enable_x64]  # type: ignore[attr-defined]
    for value in (*args, *kwargs.values()):
        if type(value) in _SCALARS or type(value) is tuple:
            parts.append(_fast_token(value))
        elif not _append_array(parts, value, array_type):
            if not hasattr(value, "__attrs_attrs__"):  # a config object (attrs, hashable) may key a call
                return None
            parts.append(_fast_token(value))
    parts.extend(kwargs)
    return _hashable(parts)


def run_eager(key: Any, values: Sequence[Any], current: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, output)`` when the validated call of ``key`` (:func:`eager_key`) ran on the fast path;
    else ``(False, None)``: take the full path. ``values``: the call's arrays; ``current()``: the
    Executor the call would use."""
    found = _MEMO.get(key) if key is not None else None
    if found is None or environment.raw(environment.EJKERNEL_OPS_RECORD) is not None:
        return False, None
    executor, entry, _ = found
    if current() is not executor or entry.chooser is not executor.chooser or not entry.still_valid():
        _MEMO.pop(key, None)
        return False, None
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
        _MEMO[key] = (executor, entry, None)
    _remember_raw(executor, entry, arrays)


class _Raw:
    """A decorated public function's remembered call: the decisions behind it (``(executor, entry)``
    pairs, all still valid for the fast path to run), ``fn`` (the kernel's jitted function, or the
    whole public function jitted) and ``picks``, the positions of ``fn``'s arguments among the raw
    call's values (``-1``: ``None``). ``fn is None``: the whole function is jitted at the next call."""

    __slots__ = ("checked", "decisions", "fn", "picks")

    def __init__(self, decisions: tuple[tuple[Any, Any], ...], fn: Callable[..., Any] | None,
                 picks: tuple[int, ...], values: tuple[Any, ...]) -> None:
        self.decisions, self.fn, self.picks = decisions, fn, picks
        self.checked = _refs(values)

    def values_checked(self, values: tuple[Any, ...]) -> bool:
        """Whether the values of these arrays were checked already: the arrays of the last call whose
        values passed, the same objects (arrays are immutable), in the same places."""
        checked = self.checked
        if len(checked) != len(values):
            return False
        return all(ref is None or ref() is value for ref, value in zip(checked, values, strict=True))


def _refs(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Weak references to the arrays among ``values`` (``None`` for the other values)."""
    array_type = _ArrayImpl
    return tuple(weakref.ref(v) if type(v) is array_type else None for v in values)


def _remember_raw(executor: Any, entry: Any, arrays: tuple[Any, ...]) -> None:
    """Keep ``entry`` for the raw call of the decorated public function under way, if any: its
    kernel's function when each of the validated ``arrays`` is one of the raw arguments as given,
    else (arrays converted by the validation, or a function that computes more than the kernel) its
    whole function, jitted at the next call."""
    raw = getattr(_pending, "call", None)
    if raw is None:
        return
    _pending.call = None
    kernel, raw_key, values, whole = raw
    if kernel is not entry.kernel:
        return
    positions = {id(v): i for i, v in enumerate(values)}
    picks = tuple(-1 if x is None else positions.get(id(x), -2) for x in arrays)
    if whole or -2 in picks:  # array work around the kernel, or arrays converted by the validation
        if raw_key not in _UNTRACEABLE:
            _MEMO[raw_key] = _Raw(((executor, entry),), None, (), values)
    else:
        _MEMO[raw_key] = _Raw(((executor, entry),), entry.fn, picks, values)


def _valid(found: _Raw, current: Callable[[], Any]) -> bool:
    executor = current()
    for owner, entry in found.decisions:
        if owner is not executor or entry.chooser is not executor.chooser or not entry.still_valid():
            return False
    return True


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
            if key is None:
                return function(*args, **kwargs)
            all_values = (*args, *kwargs.values())
            found = _MEMO.get(key)
            if type(found) is _Raw and environment.raw(environment.EJKERNEL_OPS_RECORD) is None:
                if _valid(found, current):
                    if values is not None and not found.values_checked(all_values):
                        values(*args, **kwargs)
                        found.checked = _refs(all_values)
                    fn = found.fn
                    if fn is None:
                        return _compile_whole(key, function, args, kwargs)
                    return fn(*[None if i < 0 else all_values[i] for i in found.picks])
                _MEMO.pop(key, None)
            _pending.call = (kernel, key, all_values, whole)
            try:
                return function(*args, **kwargs)
            finally:
                _pending.call = None

        return public  # type: ignore[return-value]

    return decorate


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
        _MEMO[key] = _Raw(tuple(captured), jitted, positions, values)
    else:
        _MEMO.pop(key, None)
    return out

