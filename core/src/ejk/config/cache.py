"""In-memory config cache and context-local overlays.

Keys are ``(device_fingerprint, op_id, call_key)`` triples of strings.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

import jax

from ejk._epoch import bump

__all__ = ["CacheKey", "ConfigCache", "active_overlays", "overlay_cache", "overlay_lookup"]

Cfg = TypeVar("Cfg")
CacheKey = tuple[str, str, str]

_MISSING = object()
_overlays: contextvars.ContextVar[tuple[Mapping[CacheKey, Any], ...]] = contextvars.ContextVar(
    "ejk_config_overlays", default=()
)
# What distinguishes the overlays in ``jax.jit``'s cache key: JAX's public, thread-local
# "user context" (jax.make_user_context, part of the tracing / lowering / compilation key).
# Its value is a token of the active overlays' contents (``None`` when none is active).
_make_user_context = getattr(jax, "make_user_context", None)
_jit_context: Any = _make_user_context(None) if _make_user_context is not None else None


class _Overlay(dict[CacheKey, Any]):
    """An overlay's private copy of its mapping, with its jit-key token."""

    __slots__ = ("token",)

    def __init__(self, mapping: Mapping[CacheKey, Any]) -> None:
        super().__init__(mapping)
        try:  # equal for overlays with equal contents (hashable configs) ...
            self.token: Any = frozenset((key, type(cfg), cfg) for key, cfg in self.items())
        except TypeError:  # ... else unique to this overlay
            self.token = ("overlay", object())


def _set_jit_context(stack: tuple[Mapping[CacheKey, Any], ...]) -> None:
    if _jit_context is not None:
        token = tuple(getattr(m, "token", id(m)) for m in stack) if stack else None
        _jit_context(token).__enter__()  # sets this thread's value; restored by the next set


def active_overlays() -> tuple[Mapping[CacheKey, Any], ...]:
    """The overlay stack of this context (outermost first; ``()`` when none is active).

    Every :class:`overlay_cache` entered or left sets a new tuple, and an overlay's mapping is
    a private copy, so the stack's *identity* says whether overlays changed: the Executor's
    fast path compares it with ``is``.
    """
    return _overlays.get()


def overlay_lookup(dev: str, op_id: str, call_key: str) -> tuple[bool, Any]:
    """``(found, cfg)`` from the active overlays of this context, innermost first."""
    key = (dev, op_id, call_key)
    for mapping in reversed(_overlays.get()):
        value = mapping.get(key, _MISSING)
        if value is not _MISSING:
            return True, value
    return False, None


class overlay_cache:  # noqa: N801 - a context manager named like the function it replaces
    """Temporarily shadow cache entries in this context (thread / asyncio task).

    Overlays nest (the innermost wins) and are invisible to other threads and tasks.

    Under ``jax.jit`` a config is chosen when the function is *traced*, and jit caches the
    trace. So that a trace made under an overlay is not reused where that overlay is not
    active (outside the block, or in another thread calling the same jitted function), the
    active overlays' contents are part of ``jax.jit``'s cache key, through JAX's public
    ``jax.make_user_context``: every jitted function called inside an overlay — ejk's or not —
    is traced and compiled once per distinct overlay contents (equal contents share a trace;
    an overlay holding an unhashable config gets its own). JAX keeps that value per thread,
    overlays are per ``contextvars`` context: asyncio tasks of one thread that keep overlays
    open across an ``await``, or a context copied into another thread, may still meet a trace
    made under another overlay; enter the overlay in the task or thread that calls. With a
    JAX without ``make_user_context`` the overlays are not part of the key (the trace leaks).

    Args:
        mapping: ``{(device, op_id, call_key): cfg}``.

    Example:
        >>> with overlay_cache({("cpu|cpu", "matmul@2", key): cfg}):
        ...     out = ejk.matmul(a, b)
    """

    def __init__(self, mapping: Mapping[CacheKey, Any]) -> None:
        for key in mapping:
            if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(p, str) for p in key)):
                raise ValueError(f"overlay_cache keys must be (device, op_id, call_key) string triples, got {key!r}")
        self._mapping = _Overlay(mapping)

    def __enter__(self) -> overlay_cache:
        stack = (*_overlays.get(), self._mapping)
        _overlays.set(stack)
        _set_jit_context(stack)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Leaving removes this overlay (its innermost entry) from the stack rather than restoring the
        # stack it entered on: overlays left out of order (outer first) leave none of them active.
        stack = _overlays.get()
        at = next((i for i in reversed(range(len(stack))) if stack[i] is self._mapping), None)
        if at is not None:
            stack = (*stack[:at], *stack[at + 1:])
            _overlays.set(stack)
        _set_jit_context(stack)  # the remaining stack's: consistent even when tasks interleave


class ConfigCache(Generic[Cfg]):
    """Thread-safe in-memory cache of configs keyed by device, op and call signature.

    :meth:`get` sees the active :class:`overlay_cache` entries first, then its own.
    """

    def __init__(self) -> None:
        self._data: dict[CacheKey, Cfg] = {}
        self._lock = threading.Lock()
        self._version = 0

    @property
    def version(self) -> int:
        """A counter that changes on every :meth:`put` and :meth:`clear` (decisions read from
        this cache are reused only while it is unchanged)."""
        return self._version

    def get(self, dev: str, op_id: str, call_key: str) -> Cfg | None:
        """The cached config (an overlay's first), or ``None``."""
        found, value = overlay_lookup(dev, op_id, call_key)
        if found:
            return value  # type: ignore[no-any-return]
        with self._lock:
            return self._data.get((dev, op_id, call_key))

    def get_own(self, dev: str, op_id: str, call_key: str) -> Cfg | None:
        """The config stored in this cache itself, ignoring overlays."""
        with self._lock:
            return self._data.get((dev, op_id, call_key))

    def put(self, dev: str, op_id: str, call_key: str, cfg: Cfg) -> None:
        """Store ``cfg`` under the key (replacing any previous one)."""
        with self._lock:
            self._data[(dev, op_id, call_key)] = cfg
            self._version += 1
        bump()

    def keys(self) -> list[CacheKey]:
        """A snapshot of every stored key."""
        with self._lock:
            return list(self._data)

    def items(self) -> list[tuple[CacheKey, Cfg]]:
        """A snapshot of every stored (key, config) pair."""
        with self._lock:
            return list(self._data.items())

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._data.clear()
            self._version += 1
        bump()

    def size(self) -> int:
        """The number of stored entries."""
        with self._lock:
            return len(self._data)

    def __len__(self) -> int:
        return self.size()
