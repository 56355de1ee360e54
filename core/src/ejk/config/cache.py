"""In-memory config cache and context-local overlays.

Keys are ``(device_fingerprint, op_id, call_key)`` triples of strings.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

__all__ = ["CacheKey", "ConfigCache", "active_overlays", "overlay_cache", "overlay_lookup"]

Cfg = TypeVar("Cfg")
CacheKey = tuple[str, str, str]

_MISSING = object()
_overlays: contextvars.ContextVar[tuple[Mapping[CacheKey, Any], ...]] = contextvars.ContextVar(
    "ejk_config_overlays", default=()
)


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

    Args:
        mapping: ``{(device, op_id, call_key): cfg}``.

    Example:
        >>> with overlay_cache({("cpu|cpu", "matmul@1", key): cfg}):
        ...     out = ejk.matmul(a, b)
    """

    def __init__(self, mapping: Mapping[CacheKey, Any]) -> None:
        for key in mapping:
            if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(p, str) for p in key)):
                raise ValueError(f"overlay_cache keys must be (device, op_id, call_key) string triples, got {key!r}")
        self._mapping = dict(mapping)
        self._tokens: list[contextvars.Token[tuple[Mapping[CacheKey, Any], ...]]] = []

    def __enter__(self) -> overlay_cache:
        self._tokens.append(_overlays.set((*_overlays.get(), self._mapping)))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _overlays.reset(self._tokens.pop())


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

    def size(self) -> int:
        """The number of stored entries."""
        with self._lock:
            return len(self._data)

    def __len__(self) -> int:
        return self.size()
