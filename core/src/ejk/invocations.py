"""Process-wide record of kernel invocations: device → op@version → call_key → (kernel, args, kwargs).

Filled by the Executor when ``EJKERNEL_OPS_RECORD=1``; used for batch autotuning and to
see which shapes a program really runs. Array leaves are stored as ``jax.ShapeDtypeStruct``
(never tracers or device buffers), so recording holds no memory and leaks no trace. Which
implementation each recorded call ran (e.g. ``xla/any:chunked``) is kept beside it
(:func:`get_implementations`).

Devices are named by their fingerprint (``cpu|cpu``, ``gpu|NVIDIA_H100_80GB_HBM3``); every
reader also accepts a ``jax.Device`` (or ``None`` for JAX's first device).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["clear_invocations", "get_implementations", "get_invocations", "record_invocation"]

_lock = threading.Lock()
_records: dict[str, dict[str, dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]]] = {}
_implementations: dict[str, dict[str, dict[str, str]]] = {}


def record_invocation(dev: str, op_id_v: str, call_key: str, kernel: Any, args: Any, kwargs: Any,
                      implementation: str | None = None) -> None:
    """Record one invocation (array leaves become abstract ``ShapeDtypeStruct``; containers are copied).

    ``implementation`` names what ran (``kernel.cfg_label(cfg)``, e.g. ``xla/any:chunked``), when known.
    """
    from ejk.execution.kernel import abstract_args

    stored = (kernel, tuple(abstract_args(tuple(args))), dict(abstract_args(dict(kwargs))))
    with _lock:
        _records.setdefault(dev, {}).setdefault(op_id_v, {})[call_key] = stored
        if implementation is not None:
            _implementations.setdefault(dev, {}).setdefault(op_id_v, {})[call_key] = implementation


def _device_key(dev: Any, known: dict[str, Any]) -> str:
    """The recording key of ``dev``: a fingerprint string as given (or without the plugins' facts,
    which recording does not use), or the fingerprint of a ``jax.Device`` / the default device."""
    if isinstance(dev, str):
        if dev in known:
            return dev
        base = "|".join(part for part in dev.split("|") if "=" not in part)  # drop plugin facts
        return base
    from ejk.execution.device import device_fingerprint

    return device_fingerprint(dev, plugin_facts=False)


def get_invocations(dev: Any = None) -> dict[str, dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]]:
    """A copy of ``op_id@version → call_key → (kernel, args, kwargs)`` for ``dev`` ({} if none).

    Args:
        dev: A ``jax.Device``, a device fingerprint string (as :func:`ejk.device_fingerprint`
            returns) or ``None`` for JAX's first device.
    """
    with _lock:
        key = _device_key(dev, _records)
        return {op: dict(calls) for op, calls in _records.get(key, {}).items()}


def get_implementations(dev: Any = None) -> dict[str, dict[str, str]]:
    """``op_id@version → call_key → implementation`` (e.g. ``xla/any:chunked``) of the recorded
    calls on ``dev`` (a ``jax.Device``, a fingerprint or ``None``): which implementation ran."""
    with _lock:
        key = _device_key(dev, _implementations)
        return {op: dict(calls) for op, calls in _implementations.get(key, {}).items()}


def clear_invocations() -> None:
    """Forget every recorded invocation."""
    with _lock:
        _records.clear()
        _implementations.clear()
