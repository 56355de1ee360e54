"""Many threads making their first calls at once never deadlock (issue 14).

The plugin host's lock and the registry's lazy-load lock were taken in opposite orders by a
first call with ``cfg=`` and one without. Each run happens in a fresh interpreter with the
real entry points, after ``ejk.plugins.reset_plugin_host()``; threads are joined with a
timeout and the test fails (instead of hanging) if any is still alive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

RunPython = Callable[..., Any]  # the run_python fixture of conftest.py

STRESS = """
import json, os, sys, threading, traceback, warnings

warnings.simplefilter("ignore")
import jax, jax.numpy as jnp
import ejk, ejk.plugins
from ejk_xla import FlashAttentionConfig, GroupedMatmulConfig, MatmulConfig, PagedAttentionConfig

THREADS, TIMEOUT = 16, 60.0
q = jnp.ones((1, 8, 2, 16), jnp.float32)
a = jnp.ones((8, 8), jnp.float32)
rhs = jnp.ones((2, 8, 4), jnp.float32)
sizes = jnp.array([3, 5], jnp.int32)
paged = (jnp.ones((4, 2, 16), jnp.float32), jnp.ones((4, 4, 2, 16), jnp.float32),
         jnp.ones((4, 4, 2, 16), jnp.float32), jnp.array([6, 4], jnp.int32),
         jnp.array([[0, 1], [2, 3]], jnp.int32), jnp.array([0, 2, 4], jnp.int32), 2)


def calls(with_cfg):
    pick = (lambda c: c) if with_cfg else (lambda c: None)
    ejk.flash_attention(q, q, q, cfg=pick(FlashAttentionConfig(block_q=8, block_k=8)))
    ejk.matmul(a, a, cfg=pick(MatmulConfig()))
    ejk.grouped_matmul(a, rhs, sizes, cfg=pick(GroupedMatmulConfig()))
    ejk.ragged_paged_attention(*paged, cfg=pick(PagedAttentionConfig()))


ejk.plugins.reset_plugin_host()
barrier = threading.Barrier(THREADS)
errors = []


def worker(i):
    try:
        barrier.wait(timeout=TIMEOUT)
        calls(with_cfg=i % 2 == 0)
    except BaseException:
        errors.append(traceback.format_exc())


threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join(TIMEOUT)
alive = sum(t.is_alive() for t in threads)
print(json.dumps({"alive": alive, "errors": errors[:3]}))
sys.stdout.flush()
os._exit(0)  # a deadlocked (daemon) thread must not keep the interpreter from exiting
"""


@pytest.mark.parametrize("attempt", range(3))
def test_sixteen_threads_first_calls_with_and_without_cfg(run_python: RunPython, attempt: int) -> None:
    result = run_python(STRESS, EJK_AUTOTUNE="0")
    assert result["alive"] == 0, "threads deadlocked on their first ejk call"
    assert result["errors"] == []
