"""The config selection chain: override → plugin → overlay → memory → persistent → autotune → heuristics.

Every decision is reported as a :class:`SelectionEvent` to an optional callback and to the
``ejk.selection`` logger, so "what was chosen and why" is always answerable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs

from ejk import environment
from ejk.config.cache import ConfigCache, overlay_lookup
from ejk.config.persistent import PersistentCache
from ejk.config.tuning import AutotunePolicy, TuneResult, autotune
from ejk.errors import ConfigSelectionError

if TYPE_CHECKING:
    from ejk.execution.kernel import Invocation, Kernel
    from ejk.plugins import PluginHost

__all__ = ["TIERS", "ConfigSelectorChain", "SelectionEvent"]

Cfg = TypeVar("Cfg")
logger = logging.getLogger("ejk.selection")

#: The tiers in the order they are consulted.
TIERS = ("override", "plugin", "overlay", "memory", "persistent", "autotune", "heuristic")


@attrs.frozen(kw_only=True)
class SelectionEvent:
    """One decision of the chain: which tier produced the config, and details."""

    tier: str
    op_id: str
    call_key: str
    device: str
    cfg: Any = attrs.field(eq=False)
    detail: str = ""
    tune: TuneResult[Any] | None = attrs.field(default=None, eq=False, repr=False)


class ConfigSelectorChain(Generic[Cfg]):
    """The default :class:`~ejk.ConfigChooser`.

    Args:
        cache: In-memory cache (a fresh one when omitted).
        persistent: A :class:`PersistentCache` used for every kernel; by default each
            kernel gets its own file ``<persistent_dir>/<op_id>.json``.
        policy: When and how to autotune.
        on_event: Called with every :class:`SelectionEvent`.
        plugin_host: Where the ``ejk_choose_config`` hook comes from (the global host by
            default; pass ``False`` for none).
        persistent_dir: Directory of the per-kernel files (default ``EJK_CACHE_DIR`` or the
            user cache dir). ``persist=False`` turns persistence off.
    """

    #: The Executor also passes calls with an explicit ``cfg=`` (reported as ``override`` events).
    reports_overrides = True

    def __init__(
        self,
        cache: ConfigCache[Cfg] | None = None,
        persistent: PersistentCache[Cfg] | None = None,
        policy: AutotunePolicy | None = None,
        on_event: Callable[[SelectionEvent], None] | None = None,
        *,
        plugin_host: PluginHost | bool | None = None,
        persistent_dir: str | os.PathLike[str] | None = None,
        persist: bool = True,
    ) -> None:
        self.cache: ConfigCache[Cfg] = cache if cache is not None else ConfigCache()
        self.policy = policy or AutotunePolicy()
        self.on_event = on_event
        self._persistent = persistent
        self._persistent_dir = os.fspath(persistent_dir) if persistent_dir is not None else None
        self._persist = persist
        self._plugin_host = plugin_host
        self._files: dict[str, PersistentCache[Cfg]] = {}
        self._heuristics: dict[tuple[str, str, str], Cfg] = {}
        self._tune_lock = threading.Lock()

    # -- collaborators -----------------------------------------------------------------------

    def persistent_cache(self, kernel: Kernel[Cfg, Any]) -> PersistentCache[Cfg] | None:
        """The persistent cache for ``kernel`` (``None`` when persistence is off)."""
        if not self._persist:
            return None
        if self._persistent is not None:
            return self._persistent
        cache = self._files.get(kernel.op_id)
        if cache is None:
            path = None
            if self._persistent_dir is not None:
                path = os.path.join(self._persistent_dir, f"{kernel.op_id}.json")
            cache = PersistentCache(kernel.op_id, path, loader=kernel.cfg_from_json, dumper=kernel.cfg_to_json)
            self._files[kernel.op_id] = cache
        return cache

    def _host(self) -> PluginHost | None:
        if self._plugin_host is False:
            return None
        if self._plugin_host is None or self._plugin_host is True:
            from ejk.plugins import get_plugin_host

            return get_plugin_host()
        return self._plugin_host  # type: ignore[return-value]

    def _emit(self, tier: str, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any], cfg: Any, detail: str = "",
              tune: TuneResult[Any] | None = None) -> None:
        event = SelectionEvent(tier=tier, op_id=inv.op_id_v, call_key=inv.call_key, device=inv.device,
                               cfg=cfg, detail=detail, tune=tune)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s %s: %s from %s %s", inv.op_id_v, inv.call_key[:12], kernel.describe_cfg(cfg), tier,
                         detail)
        if self.on_event is not None:
            self.on_event(event)

    # -- the chain ---------------------------------------------------------------------------

    def choose(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> Cfg:
        """Walk the tiers and return the first config found.

        Raises:
            ConfigSelectionError: when no tier produced a config.
        """
        key = inv.cache_key
        if inv.override_cfg is not None:
            self._emit("override", inv, kernel, inv.override_cfg, "explicit cfg=")
            return inv.override_cfg
        host = self._host()
        if host is not None:
            chosen = host.choose_config(inv, kernel)
            if chosen is not None:
                self._emit("plugin", inv, kernel, chosen, "ejk_choose_config hook")
                return chosen  # type: ignore[no-any-return]
        found, value = overlay_lookup(*key)
        if found:
            self._emit("overlay", inv, kernel, value)
            return value  # type: ignore[no-any-return]
        value = self.cache.get_own(*key)
        if value is not None:
            self._emit("memory", inv, kernel, value)
            return value
        persistent = self.persistent_cache(kernel)
        if persistent is not None:
            value = persistent.get(*key)
            if value is not None:
                self.cache.put(*key, value)
                self._emit("persistent", inv, kernel, value, persistent.path)
                return value
        failures = ""
        if self.policy.enabled():
            result = self._autotune(inv, kernel)
            if result is not None and result.best is not None:
                return result.best
            if result is not None:
                failures = "; ".join(f"{kernel.describe_cfg(t.cfg)}: {t.error}" for t in result.trials)
        heuristic = self._heuristics.get(key)
        if heuristic is None:
            heuristic = kernel.heuristic_cfg(inv)
            if heuristic is not None:
                self._heuristics[key] = heuristic
        if heuristic is not None:
            self._emit("heuristic", inv, kernel, heuristic)
            return heuristic
        tuning = f"autotuning found no working candidate ({failures})" if failures else "no autotuning"
        raise ConfigSelectionError(
            f"no config for {inv.op_id_v} (call {inv.call_key[:12]} on {inv.device}): no override, overlay or "
            f"cached entry, {tuning}, and {type(kernel).__name__}.heuristic_cfg returned None. "
            "Pass cfg= explicitly, enable autotuning "
            f"({environment.EJK_AUTOTUNE}=1), or implement heuristic_cfg."
        )

    def _autotune(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> TuneResult[Cfg] | None:
        candidates = list(kernel.candidate_cfgs(inv))
        if not candidates:
            return None
        key = inv.cache_key
        with self._tune_lock:  # one tuning at a time; a second caller reuses the first's answer
            value = self.cache.get_own(*key)
            if value is not None:
                self._emit("memory", inv, kernel, value)
                return TuneResult(best=value, trials=())
            start = time.perf_counter()
            result = autotune(kernel, inv, candidates, self.policy)
            if result.best is None:
                return result
            self.cache.put(*key, result.best)
            detail = f"{len(result.trials)} candidates in {time.perf_counter() - start:.2f}s"
            persistent = self.persistent_cache(kernel) if self.policy.persist else None
            if persistent is not None:
                persistent.put(*key, result.best, source="autotune", versions=kernel.cfg_versions(result.best),
                               details={"objective": self.policy.objective,
                                        "tuning": result.summary(kernel.describe_cfg)})
            self._emit("autotune", inv, kernel, result.best, detail, tune=result)
            return result

    def clear_memory(self) -> None:
        """Forget in-memory configs and memoised heuristics (persistent files stay)."""
        self.cache.clear()
        self._heuristics.clear()
