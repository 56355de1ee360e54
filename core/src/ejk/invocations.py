"""Process-wide record of kernel invocations: device → op@version → call_key → (kernel, args, kwargs).

Filled by the Executor when ``EJKERNEL_OPS_RECORD=1``; used for batch autotuning and to
see which shapes a program really runs. Array leaves are stored as ``jax.ShapeDtypeStruct``
(never tracers or device buffers), so recording holds no memory and leaks no trace.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["clear_invocations", "get_invocations", "record_invocation"]

_lock = threading.Lock()
_records: dict[str, dict[str, dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]]] = {}


def record_invocation(dev: str, op_id_v: str, call_key: str, kernel: Any, args: Any, kwargs: Any) -> None:
    """Record one invocation (array leaves become abstract ``ShapeDtypeStruct``; containers are copied)."""
    from ejk.execution.kernel import abstract_args

    stored = (kernel, tuple(abstract_args(tuple(args))), dict(abstract_args(dict(kwargs))))
    with _lock:
        _records.setdefault(dev, {}).setdefault(op_id_v, {})[call_key] = stored


def get_invocations(dev: str) -> dict[str, dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]]:
    """A copy of ``op_id@version → call_key → (kernel, args, kwargs)`` for ``dev`` ({} if none)."""
    with _lock:
        return {op: dict(calls) for op, calls in _records.get(dev, {}).items()}


def clear_invocations() -> None:
    """Forget every recorded invocation."""
    with _lock:
        _records.clear()
