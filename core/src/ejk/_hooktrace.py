"""``EJK_TRACE_HOOKS=1``: one log line per plugin hook call, through pluggy's hook-call monitoring.

Every hook call of a :class:`ejk.plugins.PluginHost` goes through pluggy (one implementation at a
time, so each plugin is isolated), so :meth:`pluggy.PluginManager.add_hookcall_monitoring` sees
each one: the line names the hook, the plugin, a summary of the arguments, the result (or the
exception) and the time it took. Lines go to the ``ejk.hooks`` logger (INFO), which writes to
stderr unless the application configured a handler for it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pluggy

__all__ = ["install", "logger", "summarize"]

logger = logging.getLogger("ejk.hooks")
_LIMIT = 160


def summarize(value: Any, limit: int = _LIMIT) -> str:
    """A short, one-line description of a hook argument or result."""
    describe = getattr(value, "describe", None)
    if callable(describe) and hasattr(value, "call_key"):  # an Invocation: op@version(shapes)
        text = str(describe())
    elif hasattr(value, "op_id") and hasattr(value, "run"):  # a Kernel
        text = f"{type(value).__name__}({value.op_id})"
    elif callable(value) and not isinstance(value, type):
        text = getattr(value, "__qualname__", None) or repr(value)
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) > 4:
        text = f"[{', '.join(summarize(v, 40) for v in value[:3])}, ... ({len(value)} items)]"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _arguments(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={summarize(value, 60)}" for name, value in kwargs.items())


def install(pm: pluggy.PluginManager) -> Callable[[], None]:
    """Log every hook call of ``pm``; returns the function that stops it."""
    local = threading.local()

    def before(hook_name: str, hook_impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
        stack = local.__dict__.setdefault("starts", [])
        stack.append(time.perf_counter())

    def after(outcome: pluggy.Result[Any], hook_name: str, hook_impls: Sequence[pluggy.HookImpl],
              kwargs: Mapping[str, Any]) -> None:
        stack = local.__dict__.setdefault("starts", [])
        elapsed_ms = (time.perf_counter() - stack.pop()) * 1e3 if stack else float("nan")
        if not hook_impls:  # a plugin without this hook: nothing was called
            return
        plugins = ", ".join(pm.get_name(impl.plugin) or "?" for impl in hook_impls)
        if outcome.exception is not None:
            result = f"raised {type(outcome.exception).__name__}: {outcome.exception}"
        else:
            value = outcome.get_result()
            if isinstance(value, list) and len(hook_impls) == 1:  # one plugin's answer, as it returned it
                value = value[0] if value else None
            result = summarize(value)
        logger.info("%s [%s](%s) -> %s (%.3f ms)", hook_name, plugins, _arguments(kwargs), result, elapsed_ms)

    if not logger.handlers:  # nobody configured it: write to stderr
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ejk hook: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    return pm.add_hookcall_monitoring(before, after)
