"""The config selection chain: override → plugin → overlay → memory → persistent → autotune → heuristics.

Every decision is reported as a :class:`SelectionEvent` to an optional callback and to the
``ejk.selection`` logger, so "what was chosen and why" is always answerable.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs

from ejk import environment
from ejk._epoch import bump
from ejk.config.cache import ConfigCache, active_overlays, overlay_lookup
from ejk.config.persistent import PersistentCache, cache_file_name
from ejk.config.tuning import AutotunePolicy, TuneResult, autotune
from ejk.errors import ConfigSelectionError, FrozenConfigMissError
from ejk.execution.kernel import state_tracked

if TYPE_CHECKING:
    from ejk.execution.kernel import Invocation, Kernel
    from ejk.plugins import PluginHost

__all__ = ["TIERS", "ConfigSelectorChain", "Reuse", "SelectionEvent"]

Cfg = TypeVar("Cfg")
logger = logging.getLogger("ejk.selection")

#: The tiers in the order they are consulted.
TIERS = ("override", "plugin", "overlay", "memory", "persistent", "autotune", "heuristic")


@attrs.frozen(kw_only=True)
class SelectionEvent:
    """One decision of the chain: which tier produced the config, and details.

    ``implementation`` names the implementation the config selects (``kernel.cfg_label``, e.g.
    ``xla/any:chunked`` for the public ops; ``None`` for a kernel with a single implementation).
    """

    tier: str
    op_id: str
    call_key: str
    device: str
    cfg: Any = attrs.field(eq=False)
    detail: str = ""
    tune: TuneResult[Any] | None = attrs.field(default=None, eq=False, repr=False)
    implementation: str | None = None


def _global_host() -> PluginHost:
    global _get_plugin_host
    if _get_plugin_host is None:  # imported when first needed: ejk.plugins imports this module's users
        from ejk.plugins import get_plugin_host

        _get_plugin_host = get_plugin_host
    return _get_plugin_host()


_get_plugin_host: Callable[[], PluginHost] | None = None


def best_by_label(kernel: Kernel[Any, Any], result: TuneResult[Any]) -> dict[str, float]:
    """The fastest median time of each implementation in a tuning result (by ``kernel.cfg_label``)."""
    best: dict[str, float] = {}
    for trial in result.trials:
        label = kernel.cfg_label(trial.cfg)
        if label is not None and trial.seconds is not None:
            best[label] = min(best.get(label, trial.seconds), trial.seconds)
    return best


class Reuse:
    """A reusable decision's check (what :meth:`ConfigSelectorChain.choose_reusable` returns with it): calling
    it says whether the decision still holds, and reports the reuse."""

    __slots__ = ("_chain", "_check", "_kernel", "_persistent")

    def __init__(self, check: Callable[[], bool], chain: ConfigSelectorChain[Any], kernel: Kernel[Any, Any],
                 persistent: PersistentCache[Any] | None = None) -> None:
        self._check, self._chain, self._kernel, self._persistent = check, chain, kernel, persistent

    def __call__(self) -> bool:
        return self._check()

    def settled(self) -> float:
        """For how many seconds a ``True`` answer stays ``True``, with nothing to report, while ejk's epoch
        (:mod:`ejk._epoch`), the context's overlay stack and ``EJK_AUTOTUNE`` stay unchanged: ``0`` while
        reuses are reported (``on_event``, the debug log) or the kernel's selection state is not tracked
        (:func:`~ejk.execution.kernel.tracked_state`); for a decision taken on a miss, until the
        persistent file (its directory's variables with it) is to be looked at again."""
        if self._chain.on_event is not None or logger.isEnabledFor(logging.DEBUG) or not state_tracked(self._kernel):
            return 0.0
        return math.inf if self._persistent is None else self._persistent.recheck_in()


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
        self._version = 0  # bumped by clear_memory (decisions made before are not reused)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        bump()  # what a reused decision's check reads: cache, policy, on_event, hook host, clear_memory's version

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
                path = os.path.join(self._persistent_dir, cache_file_name(kernel.op_id))
            cache = PersistentCache.for_op(kernel.op_id, path, loader=kernel.cfg_from_json,
                                           dumper=kernel.cfg_to_json)
            self._files[kernel.op_id] = cache
        return cache

    def _host(self) -> PluginHost | None:
        if self._plugin_host is False:
            return None
        if self._plugin_host is None or self._plugin_host is True:
            return _global_host()
        return self._plugin_host

    def _emit(self, tier: str, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any], cfg: Any, detail: str = "",
              tune: TuneResult[Any] | None = None) -> SelectionEvent:
        event = SelectionEvent(tier=tier, op_id=inv.op_id_v, call_key=inv.call_key, device=inv.device,
                               cfg=cfg, detail=detail, tune=tune,
                               implementation=None if cfg is None else kernel.cfg_label(cfg))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s %s: %s from %s %s", inv.op_id_v, inv.call_key[:12], kernel.describe_cfg(cfg), tier,
                         detail)
        if self.on_event is not None:
            self.on_event(event)
        return event

    # -- the chain ---------------------------------------------------------------------------

    def _usable(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any], tier: str, cfg: Any,
                skipped: list[str]) -> bool:
        reason = kernel.unusable_reason(inv, cfg)
        if reason is None:
            return True
        skipped.append(f"{tier} {kernel.describe_cfg(cfg)} not used: {reason}")
        logger.debug("%s %s: %s", inv.op_id_v, inv.call_key[:12], skipped[-1])
        return False

    def _lookup(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any],
                skipped: list[str]) -> tuple[str, Cfg, str] | None:
        """The first usable config of the plugin, overlay, memory and persistent tiers."""
        key = inv.cache_key
        host = self._host()
        if host is not None:
            chosen = host.choose_config(inv, kernel)
            if chosen is not None and self._usable(inv, kernel, "plugin", chosen, skipped):
                return "plugin", chosen, "ejk_choose_config hook"
        found, value = overlay_lookup(*key)
        if found and self._usable(inv, kernel, "overlay", value, skipped):
            return "overlay", value, ""
        value = self.cache.get_own(*key)
        if value is not None and self._usable(inv, kernel, "memory", value, skipped):
            return "memory", value, ""
        persistent = self.persistent_cache(kernel)
        if persistent is not None:
            value = persistent.get(*key)
            if value is not None and self._usable(inv, kernel, "persistent", value, skipped):
                return "persistent", value, persistent.path
        from ejk.config.packs import pack_config  # plugins' config packs: after the user's cache

        packed = pack_config(host, kernel, key, skipped)
        if packed is not None and self._usable(inv, kernel, "pack", packed[0], skipped):
            return "pack", packed[0], packed[1]
        return None

    def choose(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> Cfg:
        """Walk the tiers and return the first usable config found.

        Raises:
            ValueError: when an explicit ``cfg=`` cannot run the call (the kernel says why).
            FrozenConfigMissError: under the ``frozen`` policy, when no tier before autotuning
                has a config.
            ConfigSelectionError: when no tier produced a config.
        """
        return self._select(inv, kernel)[0]

    def choose_reusable(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> tuple[Cfg, Callable[[], bool] | None]:
        """:meth:`choose`, plus a check that lets the Executor reuse the decision for identical calls.

        The check (``None`` when the decision must not be reused) returns ``True`` while every
        tier would decide the same again — no plugin ``ejk_choose_config`` hook is registered,
        the context's overlay stack is the same, and neither the memory cache, nor
        :meth:`clear_memory`, nor the kernel's :meth:`~ejk.Kernel.selection_state` (for the
        public ops: the registry) changed; for a decision made on a miss (the heuristic tier)
        neither the persistent file, nor the policy, nor ``EJK_AUTOTUNE`` either — and then
        reports the reuse as :meth:`choose` would have (the same :class:`SelectionEvent` to
        ``on_event`` and the log). A plugin hook's decision is never reused (the hook is asked
        on every call); persistent and autotune decisions fill the memory cache, so the next
        call decides again, from memory, and that decision is reused. The check is a :class:`Reuse`.
        """
        if type(self).choose is not ConfigSelectorChain.choose:  # a subclass decides in its own choose
            return self.choose(inv, kernel), None
        cache, cache_version, version = self.cache, self.cache.version, self._version
        overlays, policy, kernel_state = active_overlays(), self.policy, kernel.selection_state()
        autotune_env = environment.raw(environment.EJK_AUTOTUNE)
        persistent = self.persistent_cache(kernel) if inv.override_cfg is None else None
        before = None if persistent is None else persistent.fingerprint()  # taken before deciding: never stale
        cfg, tier, event = self._select(inv, kernel)
        if event is None:
            return cfg, None
        if tier == "override":
            replay_override = self._replay(event)

            def override_valid() -> bool:  # an explicit cfg is validated again when the kernel changed
                return kernel.selection_state() == kernel_state and replay_override()

            return cfg, Reuse(override_valid, self, kernel)
        if tier not in ("overlay", "memory", "heuristic") or self._has_choose_hook():
            return cfg, None
        replay = self._replay(event)
        on_miss = tier == "heuristic"

        def still_valid() -> bool:
            if (self.cache is not cache or cache.version != cache_version or self._version != version
                    or active_overlays() is not overlays or kernel.selection_state() != kernel_state
                    or self._has_choose_hook()):
                return False
            if on_miss and (self.policy is not policy or environment.raw(environment.EJK_AUTOTUNE) != autotune_env
                            or self.persistent_cache(kernel) is not persistent
                            or (persistent is not None and persistent.recent_fingerprint() != before)):
                return False
            return replay()

        return cfg, Reuse(still_valid, self, kernel, persistent if on_miss else None)

    def _replay(self, event: SelectionEvent) -> Callable[[], bool]:
        """Report ``event`` again, as a reused decision (to ``on_event`` and the debug log)."""
        def replay() -> bool:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s %s: %s from %s %s (reused)", event.op_id, event.call_key[:12], event.cfg,
                             event.tier, event.detail)
            if self.on_event is not None:
                self.on_event(event)
            return True

        return replay

    def _has_choose_hook(self) -> bool:
        """Whether a plugin implements ``ejk_choose_config`` (its answers may change at any call)."""
        host = self._host()
        return host is not None and bool(host.pm.hook.ejk_choose_config.get_hookimpls())

    def _select(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> tuple[Cfg, str, SelectionEvent | None]:
        """The config, the tier that gave it and its event (``None`` for autotune: reported there)."""
        key = inv.cache_key
        if inv.override_cfg is not None:
            reason = kernel.unusable_reason(inv, inv.override_cfg)
            if reason is not None:
                raise ValueError(f"{inv.op_id}: cfg={kernel.describe_cfg(inv.override_cfg)} cannot run "
                                 f"{inv.describe()}: {reason}")
            return inv.override_cfg, "override", self._emit("override", inv, kernel, inv.override_cfg,
                                                            "explicit cfg=")
        skipped: list[str] = []
        hit = self._lookup(inv, kernel, skipped)
        if hit is not None:
            tier, value, detail = hit
            if tier in ("persistent", "pack"):
                self.cache.put(*key, value)
                if self.policy.effective_mode() == "autotune":  # other processes may miss where this one hits
                    from ejk.config import distributed

                    distributed.publish(inv, kernel, value)
            return value, tier, self._emit(tier, inv, kernel, value, "; ".join([detail, *skipped]).strip("; "))
        mode = self.policy.effective_mode()
        if mode == "frozen":
            raise FrozenConfigMissError(
                f"frozen policy: no tuned config for {inv.describe()} on {inv.device} (call key "
                f"{inv.call_key[:12]})" + (f"; {'; '.join(skipped)}" if skipped else "") + ". Tune it offline: "
                f"run the workload once with {environment.EJK_AUTOTUNE}=autotune and the same "
                f"{environment.EJK_CACHE_DIR}, then ship that cache directory (or `ejk cache export` / "
                "`ejk cache import` it), or pass cfg= explicitly."
            )
        failures = ""
        if mode == "autotune":
            from ejk.config import distributed  # several processes: process 0 tunes, the others receive

            received = distributed.received_config(inv, kernel)
            if received is not None and received[0] is not None:
                self.cache.put(*key, received[0])
                return received[0], "distributed", self._emit("distributed", inv, kernel, received[0], received[1])
            result = None if received is not None else self._autotune(inv, kernel)
            distributed.publish(inv, kernel, None if result is None else result.best)
            if result is not None and result.best is not None:
                return result.best, "autotune", None
            if result is not None:
                failures = "; ".join(f"{kernel.describe_cfg(t.cfg)}: {t.error}" for t in result.trials)
        heuristic = self._heuristic(inv, kernel)
        if heuristic is not None:
            tier = "heuristic" if not failures else "heuristic-after-failed-tuning"  # the latter tunes again
            return heuristic, tier, self._emit("heuristic", inv, kernel, heuristic, "; ".join(skipped))
        tuning = f"autotuning found no working candidate ({failures})" if failures else "no autotuning"
        raise ConfigSelectionError(
            f"no config for {inv.op_id_v} (call {inv.call_key[:12]} on {inv.device}): no override, overlay or "
            f"cached entry, {tuning}, and {type(kernel).__name__}.heuristic_cfg returned None. "
            "Pass cfg= explicitly, enable autotuning "
            f"({environment.EJK_AUTOTUNE}=1), or implement heuristic_cfg."
        )

    def _heuristic(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> Cfg | None:
        key = inv.cache_key
        heuristic = self._heuristics.get(key)
        if heuristic is None:
            heuristic = kernel.heuristic_cfg(inv)
            if heuristic is not None:
                self._heuristics[key] = heuristic
        return heuristic

    def peek(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> SelectionEvent:
        """What :meth:`choose` would decide for ``inv``, without tuning or caching anything.

        For a miss under the ``autotune`` policy the event's tier is ``"autotune"`` and its
        config is the heuristic one (what runs should tuning find nothing better); under
        ``frozen`` the tier is ``"frozen"`` and the config ``None`` (the call would raise).
        """
        def event(tier: str, cfg: Any, detail: str = "") -> SelectionEvent:
            return SelectionEvent(tier=tier, op_id=inv.op_id_v, call_key=inv.call_key, device=inv.device,
                                  cfg=cfg, detail=detail, implementation=None if cfg is None else kernel.cfg_label(cfg))

        if inv.override_cfg is not None:
            reason = kernel.unusable_reason(inv, inv.override_cfg)
            return event("override", inv.override_cfg, f"cannot run: {reason}" if reason else "explicit cfg=")
        skipped: list[str] = []
        hit = self._lookup(inv, kernel, skipped)
        if hit is not None:
            tier, value, detail = hit
            return event(tier, value, "; ".join([detail, *skipped]).strip("; "))
        mode = self.policy.effective_mode()
        if mode == "frozen":
            return event("frozen", None, "; ".join(["a miss: the call would raise", *skipped]))
        heuristic = self._heuristics.get(inv.cache_key) or kernel.heuristic_cfg(inv)
        if mode == "autotune":
            count = len(kernel.candidate_cfgs(inv))
            return event("autotune", heuristic, "; ".join([f"would time {count} candidates", *skipped]))
        return event("heuristic", heuristic, "; ".join(skipped))

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
            result = autotune(kernel, inv, candidates, self.policy)
            if result.best is None:
                return result
            self.cache.put(*key, result.best)
            detail = result.describe()
            persistent = self.persistent_cache(kernel) if self.policy.persist else None
            if persistent is not None:
                persistent.put(*key, result.best, source="autotune", versions=kernel.cfg_versions(result.best),
                               details={"objective": self.policy.objective,
                                        "tuning": result.summary(kernel.describe_cfg),
                                        "by_implementation": best_by_label(kernel, result)})
            self._emit("autotune", inv, kernel, result.best, detail, tune=result)
            return result

    def tuning_details(self, inv: Invocation[Cfg], kernel: Kernel[Cfg, Any]) -> dict[str, Any] | None:
        """The tuning provenance persisted with ``inv``'s entry (``None`` when it was not tuned)."""
        persistent = self.persistent_cache(kernel)
        entry = None if persistent is None else persistent.get_entry(*inv.cache_key)
        if entry is None:
            return None
        return dict(entry.provenance) if entry.source == "autotune" else None

    def clear_memory(self) -> None:
        """Forget in-memory configs and memoised heuristics (persistent files stay)."""
        self.cache.clear()
        self._heuristics.clear()
        self._version += 1  # after both: a decision made meanwhile is not reused
