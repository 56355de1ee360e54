"""Every environment variable ejk reads, in one place.

| variable | meaning |
| --- | --- |
| ``EJK_CACHE_DIR`` | directory of the persistent config caches (default: the user cache dir) |
| ``EJK_PLUGINS`` | comma-separated allow-list of plugin (entry-point) names to load |
| ``EJK_DISABLE_PLUGINS`` | comma-separated block-list of plugin names never to load |
| ``EJK_AUTOTUNE`` | on a miss: ``autotune`` (or ``1``) tunes, ``heuristics`` (``0``, default), ``frozen`` raises |
| ``EJKERNEL_OPS_RECORD`` | ``1`` records every invocation (see :func:`ejk.get_invocations`) |
| ``EJKERNEL_OPS_STAMP`` | ``hash`` (default), ``json`` or ``none``: profiler names of kernel calls |

Values are read when they are needed, never at import time.
"""

from __future__ import annotations

import os

__all__ = [
    "EJK_AUTOTUNE",
    "EJK_CACHE_DIR",
    "EJK_DISABLE_PLUGINS",
    "EJK_PLUGINS",
    "EJKERNEL_OPS_RECORD",
    "EJKERNEL_OPS_STAMP",
    "AUTOTUNE_MODES",
    "autotune_enabled",
    "autotune_mode",
    "cache_dir",
    "name_list",
    "record_enabled",
    "stamp_mode",
]

EJK_CACHE_DIR = "EJK_CACHE_DIR"
EJK_PLUGINS = "EJK_PLUGINS"
EJK_DISABLE_PLUGINS = "EJK_DISABLE_PLUGINS"
EJK_AUTOTUNE = "EJK_AUTOTUNE"
EJKERNEL_OPS_RECORD = "EJKERNEL_OPS_RECORD"
EJKERNEL_OPS_STAMP = "EJKERNEL_OPS_STAMP"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_STAMP_MODES = ("hash", "json", "none")
#: The config policies on a cache miss (see :meth:`ejk.AutotunePolicy.effective_mode`).
AUTOTUNE_MODES = ("autotune", "heuristics", "frozen")


def name_list(variable: str) -> frozenset[str] | None:
    """Parse a comma-separated list of names (lower-cased); ``None`` when unset or empty."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    return frozenset(part.strip().lower() for part in raw.split(",") if part.strip())


def cache_dir() -> str:
    """The persistent cache directory: ``EJK_CACHE_DIR`` or the user cache dir (not created here)."""
    explicit = os.environ.get(EJK_CACHE_DIR, "").strip()
    if explicit:
        return os.path.expanduser(explicit)
    import platformdirs

    return platformdirs.user_cache_dir("ejk", appauthor=False)


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
