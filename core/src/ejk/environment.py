"""Every environment variable ejk reads, in one place.

| variable | meaning |
| --- | --- |
| ``EJK_CACHE_DIR`` | directory of the persistent config caches (default: the user cache dir) |
| ``EJK_PLUGINS`` | comma-separated allow-list of plugin (entry-point) names to load |
| ``EJK_DISABLE_PLUGINS`` | comma-separated block-list of plugin names never to load |
| ``EJK_AUTOTUNE`` | on a miss: ``autotune`` (or ``1``) tunes, ``heuristics`` (``0``, default), ``frozen`` raises |
| ``EJKERNEL_OPS_RECORD`` | ``1`` records every invocation (see :func:`ejk.get_invocations`) |
| ``EJKERNEL_OPS_STAMP`` | ``hash`` (default), ``json`` or ``none``: profiler names of kernel calls |
| ``EJK_TRACE_HOOKS`` | ``1`` logs every plugin hook call (plugin, arguments, result, time) to stderr |

Values are read when they are needed, never at import time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

__all__ = [
    "EJK_AUTOTUNE",
    "EJK_CACHE_DIR",
    "EJK_DISABLE_PLUGINS",
    "EJK_PLUGINS",
    "EJKERNEL_OPS_RECORD",
    "EJKERNEL_OPS_STAMP",
    "EJK_TRACE_HOOKS",
    "AUTOTUNE_MODES",
    "autotune_enabled",
    "autotune_mode",
    "cache_dir",
    "name_list",
    "raw",
    "raw_reader",
    "record_enabled",
    "stamp_mode",
    "trace_hooks",
]

EJK_CACHE_DIR = "EJK_CACHE_DIR"
EJK_PLUGINS = "EJK_PLUGINS"
EJK_DISABLE_PLUGINS = "EJK_DISABLE_PLUGINS"
EJK_AUTOTUNE = "EJK_AUTOTUNE"
EJKERNEL_OPS_RECORD = "EJKERNEL_OPS_RECORD"
EJKERNEL_OPS_STAMP = "EJKERNEL_OPS_STAMP"
EJK_TRACE_HOOKS = "EJK_TRACE_HOOKS"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_STAMP_MODES = ("hash", "json", "none")
#: The config policies on a cache miss (see :meth:`ejk.AutotunePolicy.effective_mode`).
AUTOTUNE_MODES = ("autotune", "heuristics", "frozen")


# ``os.environ.get`` encodes the name and decodes the value on every call; the
# Executor's fast path reads a few variables on every eager call only to see whether they
# changed, so it reads the mapping's own store (what ``os.environ[name]`` reads) when there is one.
_environ_store = getattr(os.environ, "_data", None)
_environ_encode = getattr(os.environ, "encodekey", None)
_encoded_names: dict[str, object] = {}


def raw(name: str) -> object:
    """The raw value of variable ``name`` (``None`` when unset), only for comparing with an earlier
    raw value (it may be bytes): equal raw values mean an equal ``os.environ.get(name)``."""
    if not isinstance(_environ_store, dict) or _environ_encode is None:
        return os.environ.get(name)
    key = _encoded_names.get(name)
    if key is None:
        key = _encoded_names[name] = _environ_encode(name)
    return _environ_store.get(key)


def raw_reader(name: str) -> Callable[[], object]:
    """A function returning :func:`raw` of ``name``, three times cheaper to call (the eager fast path
    reads a few variables on every call)."""
    if not isinstance(_environ_store, dict) or _environ_encode is None:
        return functools.partial(os.environ.get, name)
    return functools.partial(_environ_store.get, _environ_encode(name))


def name_list(variable: str) -> frozenset[str] | None:
    """Parse a comma-separated list of names (lower-cased); ``None`` when unset or empty."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    return frozenset(part.strip().lower() for part in raw.split(",") if part.strip())


#: The variables :func:`cache_dir`'s answer depends on (``platformdirs`` and ``expanduser`` read the others).
_CACHE_DIR_INPUTS = ((EJK_CACHE_DIR, "LOCALAPPDATA", "USERPROFILE", "APPDATA") if os.name == "nt"
                     else (EJK_CACHE_DIR, "HOME", "XDG_CACHE_HOME"))
_cache_dir_memo: tuple[tuple[object, ...], str] | None = None


def cache_dir() -> str:
    """The persistent cache directory: ``EJK_CACHE_DIR`` or the user cache dir (not created here).

    Resolved again whenever one of the variables it depends on changes (it is asked on every
    eager call that reaches the persistent tier, and ``platformdirs`` is slow).
    """
    global _cache_dir_memo
    inputs = tuple([raw(name) for name in _CACHE_DIR_INPUTS])
    memo = _cache_dir_memo
    if memo is not None and memo[0] == inputs:
        return memo[1]
    explicit = os.environ.get(EJK_CACHE_DIR, "").strip()
    if explicit:
        resolved = os.path.expanduser(explicit)
    else:
        import platformdirs

        resolved = platformdirs.user_cache_dir("ejk", appauthor=False)
    _cache_dir_memo = (inputs, resolved)
    return resolved


def autotune_mode() -> str:
    """The config policy ``EJK_AUTOTUNE`` asks for on a cache miss: one of :data:`AUTOTUNE_MODES`.

    ``1``, ``true``, ``yes``, ``on`` and ``autotune`` mean ``"autotune"``; ``0``, ``false``, ``no``,
    ``off``, ``heuristics`` and an unset or empty variable mean ``"heuristics"``; ``frozen`` means
    ``"frozen"`` (a miss raises). Case and surrounding spaces are ignored.

    Raises:
        ValueError: for any other value, naming the variable and the valid values.
    """
    value = os.environ.get(EJK_AUTOTUNE, "").strip().lower()
    if value in _TRUE or value == "autotune":
        return "autotune"
    if not value or value in _FALSE or value == "heuristics":
        return "heuristics"
    if value == "frozen":
        return "frozen"
    valid = ", ".join([*sorted(_TRUE), "autotune", *sorted(_FALSE), "heuristics", "frozen"])
    raise ValueError(f"{EJK_AUTOTUNE}={value!r} is not supported; use one of {valid}")


def autotune_enabled() -> bool:
    """Whether ``EJK_AUTOTUNE`` asks the default chooser to autotune on a cache miss."""
    return autotune_mode() == "autotune"


def record_enabled() -> bool:
    """Whether ``EJKERNEL_OPS_RECORD=1`` asks the Executor to record invocations."""
    return os.environ.get(EJKERNEL_OPS_RECORD, "0").strip().lower() in _TRUE


def trace_hooks() -> bool:
    """Whether ``EJK_TRACE_HOOKS=1`` asks for a log line per plugin hook call (read when a
    :class:`ejk.plugins.PluginHost` is created)."""
    return os.environ.get(EJK_TRACE_HOOKS, "0").strip().lower() in _TRUE


def stamp_mode() -> str:
    """The profiler stamp mode from ``EJKERNEL_OPS_STAMP`` (``hash`` when unset).

    Raises:
        ValueError: for a value other than ``hash``, ``json`` or ``none``.
    """
    mode = os.environ.get(EJKERNEL_OPS_STAMP, "hash").strip().lower() or "hash"
    if mode not in _STAMP_MODES:
        raise ValueError(
            f"{EJKERNEL_OPS_STAMP}={mode!r} is not supported; use one of {', '.join(_STAMP_MODES)}"
        )
    return mode
