"""One process-wide counter of the changes that may alter a remembered decision.

The eager fast path of the public ops (:mod:`ejk.ops._eager`) asks the chooser's check of a remembered
decision once, then reuses the decision without asking again while this counter stays unchanged, and
with it what the counter cannot see: the calling context's Executor and overlay stack, ``EJK_AUTOTUNE``
and, for a decision taken on a miss, the persistent file another process may write (looked at again
every :data:`ejk.config.persistent.RECHECK_S`).

Every change that the chooser's check reads bumps it, *after* the change is made:

- a :class:`~ejk.ConfigCache` put or clear;
- any attribute set on a :class:`~ejk.ConfigSelectorChain` (its cache, policy, ``on_event``, hook host,
  persistence; :meth:`~ejk.ConfigSelectorChain.clear_memory`) or on an :class:`~ejk.Executor` (its chooser);
- a :class:`~ejk.KernelRegistry` change (implementations registered or removed, a loader set, a reset,
  :meth:`~ejk.KernelRegistry.touch`) and a public op's kernel given another registry;
- a plugin registered with a :class:`~ejk.plugins.PluginHost`'s manager (its ``ejk_choose_config`` hook);
- an entry put into a :class:`~ejk.PersistentCache` by this process.
"""

from __future__ import annotations

import threading

__all__ = ["EPOCH", "bump"]

#: ``EPOCH[0]``: the counter (a list: read without a lock, as ``EPOCH[0]``, by the fast path).
EPOCH = [0]
_lock = threading.Lock()


def bump() -> None:
    """Note a change (already made) that may alter a remembered decision."""
    with _lock:  # never lost to a concurrent bump: a reader's earlier value never comes back
        EPOCH[0] += 1
