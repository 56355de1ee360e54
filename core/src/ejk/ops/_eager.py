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
- :func:`eager_fast_path`, a decorator of public functions whose validation depends only on shapes,
  dtypes and the static arguments (not on array values): keyed by the raw arguments and the JAX
  settings validation reads (``jax_default_matmul_precision``, dtype promotion, x64), it skips the
  validation too.

Both include ``EJKERNEL_OPS_STAMP``. Only concrete arrays take them (under a trace the cost does not
recur), not while calls are recorded (``EJKERNEL_OPS_RECORD``: the Executor records every call), and
not for calls that ran sharded.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax

from ejk import environment
from ejk.execution.executor import _fast_token

__all__ = ["eager_fast_path", "eager_key", "remember", "run_eager"]

F = TypeVar("F", bound=Callable[..., Any])
_SIZE = 4096
#: key -> (executor, its fast-path entry, where the entry's arrays are among the key's values or None)
_MEMO: dict[Any, tuple[Any, Any, tuple[int, ...] | None]] = {}
_ArrayImpl: type | None = None
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
    """``(True, output)`` when the call of ``key`` ran on the fast path; else ``(False, None)``: take the
    full path. ``values``: the call's arrays (``run_op``) or raw arguments (:func:`eager_fast_path`);
    ``current()``: the Executor the call would use."""
    found = _MEMO.get(key) if key is not None else None
    if found is None or environment.raw(environment.EJKERNEL_OPS_RECORD) is not None:
        return False, None
    executor, entry, picks = found
    if current() is not executor or entry.chooser is not executor.chooser or not entry.still_valid():
        _MEMO.pop(key, None)
        return False, None
    if picks is None:
        _remember_raw(executor, entry, tuple(values))  # a decorated function's call that led here
        return True, entry.fn(*values)
    return True, entry.fn(*[None if i < 0 else values[i] for i in picks])


def remember(key: Any, executor: Any, entry: Any, arrays: tuple[Any, ...]) -> None:
    """Keep ``entry`` (:meth:`ejk.Executor.fast_entry` of the validated call just run on ``arrays``) for
    the calls of ``key``, and for the raw call of a public function decorated with
    :func:`eager_fast_path` that led here, when its arrays are among its raw arguments."""
    if entry is None:
        _pending.call = None
        return
    if len(_MEMO) >= _SIZE:
        _MEMO.clear()  # bounded; the next calls fill it again
    if key is not None:
        _MEMO[key] = (executor, entry, None)
    _remember_raw(executor, entry, arrays)


def _remember_raw(executor: Any, entry: Any, arrays: tuple[Any, ...]) -> None:
    """Keep ``entry`` for the raw call of the decorated public function under way, if any, when each of
    the validated ``arrays`` is one of its raw arguments as given."""
    raw = getattr(_pending, "call", None)
    if raw is None:
        return
    _pending.call = None
    kernel, raw_key, values = raw
    if kernel is not entry.kernel:
        return
    positions = {id(v): i for i, v in enumerate(values)}
    picks = tuple(-1 if x is None else positions.get(id(x), -2) for x in arrays)
    if -2 not in picks:  # none converted by the validation
        _MEMO[raw_key] = (executor, entry, picks)


def eager_fast_path(kernel: Any, current: Callable[[], Any]) -> Callable[[F], F]:
    """Decorate the public function of ``kernel``'s op (whose validation reads shapes, dtypes and static
    arguments, never array values): an eager call identical to an earlier one — concrete arrays of the
    same shapes, dtypes and shardings, equal plain arguments — skips the validation and runs the jitted
    function of the earlier call while its decision holds (``current()``: the Executor in use)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def public(*args: Any, **kwargs: Any) -> Any:
            key = _raw_key(kernel, args, kwargs)
            if key is None:
                return function(*args, **kwargs)
            values = (*args, *kwargs.values())
            done, out = run_eager(key, values, current)
            if done:
                return out
            _pending.call = (kernel, key, values)
            try:
                return function(*args, **kwargs)
            finally:
                _pending.call = None

        return public  # type: ignore[return-value]

    return decorate
