"""Multi-process tuning: one process tunes a call, the others receive its choice.

When several processes run the same program (``jax.distributed.initialize``: hosts of one job,
or processes of one host), each traces the same ops in the same order. Under autotuning,
process 0 times the candidates of a call and publishes the winner in ``jax.distributed``'s
key-value store; every other process waits for it there instead of timing on its own, so every
process compiles the same kernels with the same configs (and nobody's timing noise splits the
job). With one process, or before ``jax.distributed`` is initialised, nothing changes.

The winner is persisted by process 0 (a shared cache directory then serves everyone next time;
persistent files are written atomically) and put into the others' memory caches.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any

__all__ = ["TIMEOUT_S", "coordination", "publish", "received_config"]

#: How long a process waits for process 0's tuning result before deciding by itself.
TIMEOUT_S = 1800.0
_PREFIX = "ejk/tuned/"


def coordination() -> tuple[Any, int, int] | None:
    """``(key-value client, process id, process count)`` when several processes share a job, else ``None``."""
    try:
        from jax._src import distributed  # the client of jax.distributed.initialize (no public accessor)
    except ImportError:
        return None
    state = distributed.global_state
    if state.client is None or not state.num_processes or state.num_processes <= 1:
        return None
    return state.client, int(state.process_id), int(state.num_processes)


def _key(cache_key: tuple[str, str, str]) -> str:
    return _PREFIX + hashlib.sha256("\0".join(cache_key).encode()).hexdigest()


def received_config(inv: Any, kernel: Any, timeout_s: float = TIMEOUT_S) -> tuple[Any, str] | None:
    """On a process other than 0: process 0's tuned config for this call and a detail line.

    ``None`` on process 0 and without coordination (tune locally). When process 0 found no
    working candidate the result is ``(None, detail)``; when it never answers within
    ``timeout_s``, or its answer cannot be rebuilt here, this warns and returns ``None``.
    """
    ctx = coordination()
    if ctx is None or ctx[1] == 0:
        return None
    client, process, count = ctx
    try:
        text = client.blocking_key_value_get(_key(inv.cache_key), int(timeout_s * 1000))
        data = json.loads(text)
        cfg = None if data is None else kernel.cfg_from_json(data)
    except Exception as exc:
        warnings.warn(f"{inv.op_id_v}: no tuning result from process 0 ({type(exc).__name__}: {exc}); "
                      f"process {process} tunes this call itself", RuntimeWarning, stacklevel=3)
        return None
    return cfg, f"tuned by process 0 of {count}"


def publish(inv: Any, kernel: Any, best: Any) -> None:
    """On process 0: publish the tuning result of this call (``None``: no working candidate)."""
    ctx = coordination()
    if ctx is None or ctx[1] != 0:
        return
    text = json.dumps(None if best is None else kernel.cfg_to_json(best), sort_keys=True)
    try:
        ctx[0].key_value_set(_key(inv.cache_key), text, allow_overwrite=True)
    except TypeError:  # older clients: no overwrite flag
        ctx[0].key_value_set(_key(inv.cache_key), text)
