"""ConfigSelectorChain, tier by tier, and the autotuner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectionError,
    ConfigSelectorChain,
    Executor,
    Invocation,
    Kernel,
    KernelRegistry,
    SelectionEvent,
    autotune,
    overlay_cache,
)
from ejk._versions import installed_version
from ejk.plugins import PluginHost


@attrs.frozen(kw_only=True)
class Cfg:
    """``reps`` chained matmuls: 1 is cheap, 200 is ~200x the work. ``mode`` injects failures."""

    reps: int = 1
    mode: str = "ok"


FAST, SLOW, SLOWER = Cfg(reps=1), Cfg(reps=120), Cfg(reps=240)
BOOM, NAN, RUNFAIL = Cfg(reps=1, mode="boom"), Cfg(reps=1, mode="nan"), Cfg(reps=1, mode="runfail")


def _device_fault(x: np.ndarray) -> np.ndarray:
    raise ValueError("simulated device fault")


class Toy(Kernel[Cfg, jax.Array]):
    op_id = "toy"
    version = "1"
    cfg_type = Cfg

    def __init__(self, candidates: tuple[Cfg, ...] = (SLOW, FAST, SLOWER), heuristic: Cfg | None = Cfg(reps=2),
                 versions: dict[str, str] | None = None) -> None:
        self.candidates = candidates
        self.heuristic = heuristic
        self.versions = versions or {}
        self.tuning_shapes: list[Any] = []

    def run(self, x: jax.Array, *, cfg: Cfg, scale: float = 1.0) -> jax.Array:
        if cfg.mode == "boom":
            raise RuntimeError("this candidate does not lower")
        y = jax.lax.fori_loop(0, cfg.reps, lambda i, y: jnp.tanh(y @ x), x)
        if cfg.mode == "nan":
            y = y * jnp.nan
        if cfg.mode == "runfail":  # compiles, then fails when it runs
            y = jax.pure_callback(_device_fault, jax.ShapeDtypeStruct(y.shape, y.dtype), y)
        return y * scale

    def heuristic_cfg(self, inv: Invocation[Cfg]) -> Cfg | None:
        return self.heuristic

    def candidate_cfgs(self, inv: Invocation[Cfg]) -> tuple[Cfg, ...]:
        return self.candidates

    def tuning_args(self, inv: Invocation[Cfg], seed: int = 0) -> tuple[Any, ...]:
        args = super().tuning_args(inv, seed)
        self.tuning_shapes.append([type(a) for a in args])
        return args

    def cfg_versions(self, cfg: Cfg) -> dict[str, str]:
        return self.versions


def reference(x: jax.Array, cfg: Cfg) -> np.ndarray:
    y = np.asarray(x, np.float64)
    out = y
    for _ in range(cfg.reps):
        out = np.tanh(out @ y)
    return out


X = jnp.asarray(np.random.default_rng(0).standard_normal((128, 128)) / 12, jnp.float32)
# Toy's candidates compute different values on purpose (``reps`` sets the cost), so these
# tests turn the autotuner's output check off; test_tuning.py covers the check.
POLICY = AutotunePolicy(autotune=True, warmup=1, repeats=3, progress=False, check_outputs=False)


class Recorder:
    def __init__(self) -> None:
        self.events: list[SelectionEvent] = []

    def __call__(self, event: SelectionEvent) -> None:
        self.events.append(event)

    @property
    def tiers(self) -> list[str]:
        return [e.tier for e in self.events]


def make_chain(tmp_path: Path, policy: AutotunePolicy = POLICY, host: Any = False,
               **kwargs: Any) -> tuple[ConfigSelectorChain[Cfg], Recorder]:
    recorder = Recorder()
    chain: ConfigSelectorChain[Cfg] = ConfigSelectorChain(policy=policy, on_event=recorder, plugin_host=host,
                                                          persistent_dir=tmp_path / "cache", **kwargs)
    return chain, recorder


def invocation(kernel: Kernel[Cfg, Any], x: Any = X, cfg: Cfg | None = None, **kwargs: Any) -> Invocation[Cfg]:
    return Executor(ConfigSelectorChain(plugin_host=False)).invocation(kernel, (x,), kwargs, cfg)


def cache_file(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "toy.json"


# -- override -------------------------------------------------------------------------------------


def test_override_wins_over_everything_and_is_never_persisted(tmp_path: Path) -> None:
    kernel = Toy()
    chain, rec = make_chain(tmp_path)
    inv = invocation(kernel, cfg=Cfg(reps=7))
    chain.cache.put(*inv.cache_key, Cfg(reps=3))
    chain.persistent_cache(kernel).put(*inv.cache_key, Cfg(reps=4))  # type: ignore[union-attr]
    before = cache_file(tmp_path).read_text()
    with overlay_cache({inv.cache_key: Cfg(reps=5)}):
        assert chain.choose(inv, kernel) == Cfg(reps=7)
    assert rec.tiers == ["override"]
    assert rec.events[0].detail == "explicit cfg="
    assert chain.cache.get_own(*inv.cache_key) == Cfg(reps=3)
    assert cache_file(tmp_path).read_text() == before
    assert kernel.tuning_shapes == []  # never tuned


def test_executor_explicit_cfg_wins_with_autotuning_on(tmp_path: Path) -> None:
    kernel = Toy()
    chain, rec = make_chain(tmp_path)
    ex = Executor(chain)
    out = ex(kernel, X, cfg=Cfg(reps=2))
    np.testing.assert_allclose(out, reference(X, Cfg(reps=2)), rtol=1e-4, atol=1e-5)
    assert ex.choose_config(kernel, X, cfg=Cfg(reps=9)) == Cfg(reps=9)
    assert kernel.tuning_shapes == []
    assert chain.cache.size() == 0
    assert not cache_file(tmp_path).exists()
    assert rec.tiers == ["override", "override"]  # reported as such, never tuned, cached or persisted
    assert [e.cfg for e in rec.events] == [Cfg(reps=2), Cfg(reps=9)]


# -- plugin hook ----------------------------------------------------------------------------------


def test_plugin_hook_chooses_before_caches(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    class TeamPolicy:
        @ejk.hookimpl
        def ejk_choose_config(self, invocation: Invocation[Any], kernel: Kernel[Any, Any]) -> Any:
            seen.append((invocation.op_id_v, type(kernel).__name__))
            return Cfg(reps=11) if invocation.kwargs.get("scale") == 2.0 else None

    host = PluginHost(KernelRegistry(), load_entry_points=False)
    host.register_plugin(TeamPolicy(), "team-policy")
    kernel = Toy()
    chain, rec = make_chain(tmp_path, AutotunePolicy(autotune=False), host=host)
    inv = invocation(kernel, scale=2.0)
    chain.cache.put(*inv.cache_key, Cfg(reps=3))
    with overlay_cache({inv.cache_key: Cfg(reps=5)}):
        assert chain.choose(inv, kernel) == Cfg(reps=11)
    assert rec.tiers == ["plugin"]
    assert seen == [("toy@1", "Toy")]
    assert chain.cache.get_own(*inv.cache_key) == Cfg(reps=3)  # not cached
    assert not cache_file(tmp_path).exists()  # not persisted
    # Returning None lets the chain decide.
    assert chain.choose(invocation(kernel, scale=1.0), kernel) == Cfg(reps=2)
    assert rec.tiers == ["plugin", "heuristic"]


def test_plugin_hook_that_raises_is_isolated(tmp_path: Path) -> None:
    class Broken:
        @ejk.hookimpl
        def ejk_choose_config(self, invocation: Invocation[Any]) -> Any:
            raise KeyError("oops")

    class Good:
        @ejk.hookimpl
        def ejk_choose_config(self, invocation: Invocation[Any], kernel: Kernel[Any, Any]) -> Any:
            return Cfg(reps=13)

    host = PluginHost(KernelRegistry(), load_entry_points=False)
    host.register_plugin(Good(), "good")
    host.register_plugin(Broken(), "broken")  # "broken" < "good": called first
    chain, _ = make_chain(tmp_path, AutotunePolicy(autotune=False), host=host)
    with pytest.warns(RuntimeWarning, match="'broken': ejk_choose_config raised KeyError"):
        assert chain.choose(invocation(Toy()), Toy()) == Cfg(reps=13)
    assert host.plugins["broken"].hook_errors == ["ejk_choose_config raised KeyError: 'oops'"]


# -- overlay, memory, persistent ------------------------------------------------------------------


def test_overlay_tier(tmp_path: Path) -> None:
    kernel = Toy()
    chain, rec = make_chain(tmp_path)
    inv = invocation(kernel)
    chain.cache.put(*inv.cache_key, Cfg(reps=3))
    with overlay_cache({inv.cache_key: Cfg(reps=5)}):
        assert chain.choose(inv, kernel) == Cfg(reps=5)
    assert chain.choose(inv, kernel) == Cfg(reps=3)
    assert rec.tiers == ["overlay", "memory"]
    assert chain.cache.get_own(*inv.cache_key) == Cfg(reps=3)


def test_memory_tier_uses_the_given_cache(tmp_path: Path) -> None:
    kernel = Toy()
    shared: ConfigCache[Cfg] = ConfigCache()
    chain, rec = make_chain(tmp_path, cache=shared)
    inv = invocation(kernel)
    shared.put(*inv.cache_key, Cfg(reps=6))
    assert chain.choose(inv, kernel) == Cfg(reps=6)
    assert rec.tiers == ["memory"]
    assert kernel.tuning_shapes == []


def test_persistent_tier_from_a_new_chain_on_the_same_directory(tmp_path: Path) -> None:
    kernel = Toy()
    first, _ = make_chain(tmp_path)
    inv = invocation(kernel)
    assert first.choose(inv, kernel) == FAST
    second, rec = make_chain(tmp_path, AutotunePolicy(autotune=False))
    chosen = second.choose(inv, Toy())
    assert chosen == FAST and isinstance(chosen, Cfg)  # rebuilt with Kernel.cfg_type
    assert rec.tiers == ["persistent"]
    assert rec.events[0].detail == str(cache_file(tmp_path))
    assert second.cache.get_own(*inv.cache_key) == FAST  # promoted to memory
    assert second.choose(inv, kernel) == FAST
    assert rec.tiers == ["persistent", "memory"]


def test_persistent_tier_honours_ejk_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_CACHE_DIR", str(tmp_path / "env-cache"))
    kernel = Toy(candidates=(FAST,))
    chain: ConfigSelectorChain[Cfg] = ConfigSelectorChain(policy=POLICY, plugin_host=False)
    assert chain.choose(invocation(kernel), kernel) == FAST
    assert (tmp_path / "env-cache" / "toy.json").is_file()


def test_stale_persistent_entry_is_retuned(tmp_path: Path) -> None:
    kernel = Toy(candidates=(SLOW, FAST))
    chain, _ = make_chain(tmp_path)
    inv = invocation(kernel)
    chain.persistent_cache(kernel).put(*inv.cache_key, SLOW, versions={"jax": "0.0.1"})  # type: ignore[union-attr]
    fresh, rec = make_chain(tmp_path)
    with pytest.warns(ejk.StaleCacheWarning, match="jax 0.0.1"):
        assert fresh.choose(inv, kernel) == FAST
    assert rec.tiers == ["autotune"]


def test_persist_false_writes_nothing(tmp_path: Path) -> None:
    kernel = Toy()
    chain, rec = make_chain(tmp_path, persist=False)
    assert chain.persistent_cache(kernel) is None
    assert chain.choose(invocation(kernel), kernel) == FAST
    assert not (tmp_path / "cache").exists()
    chain2, _ = make_chain(tmp_path, AutotunePolicy(autotune=True, persist=False, repeats=2, check_outputs=False))
    assert chain2.choose(invocation(kernel), kernel) == FAST
    assert not (tmp_path / "cache").exists()
    assert rec.tiers == ["autotune"]


# -- autotune -------------------------------------------------------------------------------------


def test_autotune_picks_the_fastest_and_persists_with_provenance(tmp_path: Path) -> None:
    kernel = Toy(candidates=(SLOW, BOOM, FAST, NAN, RUNFAIL, SLOWER),
                 versions={"pluggy": installed_version("pluggy") or "?"})  # e.g. the plugin's toolkit
    chain, rec = make_chain(tmp_path)
    inv = invocation(kernel)
    assert chain.choose(inv, kernel) == FAST
    assert rec.tiers == ["autotune"]
    event = rec.events[0]
    assert event.cfg == FAST and event.call_key == inv.call_key and event.op_id == "toy@1"
    assert event.tune is not None
    trials = {t.cfg: t for t in event.tune.trials}
    assert len(event.tune.trials) == 6
    assert trials[BOOM].seconds is None
    assert trials[BOOM].error is not None and "compile failed" in trials[BOOM].error
    assert "this candidate does not lower" in trials[BOOM].error
    assert trials[NAN].seconds is None and trials[NAN].error == "produced NaN or infinite values"
    assert trials[RUNFAIL].seconds is None and trials[RUNFAIL].compile_seconds is not None
    assert trials[RUNFAIL].error is not None and trials[RUNFAIL].error.startswith("run failed")
    assert "simulated device fault" in trials[RUNFAIL].error
    for good in (FAST, SLOW, SLOWER):
        assert trials[good].error is None
        assert trials[good].seconds is not None and len(trials[good].times) == 3
        assert trials[good].compile_seconds is not None
    assert trials[FAST].seconds < trials[SLOW].seconds  # type: ignore[operator]
    assert chain.cache.get_own(*inv.cache_key) == FAST

    raw = json.loads(cache_file(tmp_path).read_text())
    stored = raw["entries"][inv.device]["toy@1"][inv.call_key]
    assert stored["cfg"] == {"reps": 1, "mode": "ok"}
    assert stored["source"] == "autotune"
    versions = stored["provenance"]["versions"]
    assert versions["jax"] == installed_version("jax") and versions["jaxlib"] == installed_version("jaxlib")
    assert versions["ejk-core"] == installed_version("ejk-core")
    assert versions["pluggy"] == installed_version("pluggy")  # Kernel.cfg_versions is recorded
    tuning = stored["provenance"]["tuning"]
    assert [t["error"] is None for t in tuning] == [True, False, True, False, False, True]

    assert chain.choose(inv, kernel) == FAST  # now from memory, no second tuning
    assert rec.tiers == ["autotune", "memory"]
    assert len(kernel.tuning_shapes) == 1


def test_autotune_direct_call_and_max_candidates() -> None:
    kernel = Toy()
    inv = invocation(kernel)
    result = autotune(kernel, inv, [SLOWER, FAST, SLOW], AutotunePolicy(repeats=2, max_candidates=2,
                                                                        progress=False, check_outputs=False))
    assert result.best == FAST
    assert [t.cfg for t in result.trials] == [SLOWER, FAST]
    summary = result.summary(repr)
    assert [s["cfg"] for s in summary] == [repr(SLOWER), repr(FAST)]
    empty = autotune(kernel, inv, [BOOM, NAN], AutotunePolicy(repeats=1, progress=False, check_outputs=False))
    assert empty.best is None and len(empty.trials) == 2


def test_autotune_inside_jit_tunes_on_concrete_inputs(tmp_path: Path) -> None:
    kernel = Toy(candidates=(SLOWER, NAN, FAST, SLOW))
    chain, rec = make_chain(tmp_path)
    ex = Executor(chain)

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        return ex(kernel, x) + 1.0

    with jax.checking_leaks():
        out = f(X)
    np.testing.assert_allclose(out, reference(X, FAST) + 1.0, rtol=1e-4, atol=1e-5)
    assert rec.tiers == ["autotune"]
    assert rec.events[0].cfg == FAST
    # tuning ran on concrete arrays (never the tracer of the outer jit) ...
    assert kernel.tuning_shapes and not any(issubclass(t, jax.core.Tracer)
                                            for t in kernel.tuning_shapes[0])
    # ... and nothing the chain keeps holds a tracer.
    leaves = jax.tree.leaves([(e.cfg, e.tune) for e in rec.events], is_leaf=lambda x: x is None)
    assert not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)
    assert cache_file(tmp_path).is_file()
    assert f(X * 2).shape == X.shape  # same signature: no retrace, so no new selection
    assert rec.tiers == ["autotune"]


def test_autotune_with_no_working_candidate_falls_back_to_heuristics(tmp_path: Path) -> None:
    kernel = Toy(candidates=(BOOM, NAN), heuristic=Cfg(reps=3))
    chain, rec = make_chain(tmp_path)
    assert chain.choose(invocation(kernel), kernel) == Cfg(reps=3)
    assert rec.tiers == ["heuristic"]
    assert not cache_file(tmp_path).exists()


def test_autotune_env_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = Toy(candidates=(SLOW, FAST))
    policy = AutotunePolicy(repeats=2, progress=False, check_outputs=False)  # autotune=None follows EJK_AUTOTUNE
    assert not policy.enabled()
    chain, rec = make_chain(tmp_path, policy)
    assert chain.choose(invocation(kernel), kernel) == Cfg(reps=2)
    monkeypatch.setenv("EJK_AUTOTUNE", "1")
    assert policy.enabled()
    chain2, rec2 = make_chain(tmp_path, policy)
    assert chain2.choose(invocation(kernel), kernel) == FAST
    assert rec.tiers == ["heuristic"] and rec2.tiers == ["autotune"]


def test_autotune_policy_validation() -> None:
    with pytest.raises(ValueError):
        AutotunePolicy(repeats=0)
    with pytest.raises(ValueError):
        AutotunePolicy(warmup=-1)


# -- heuristics and errors ------------------------------------------------------------------------


def test_heuristic_is_used_when_autotune_is_off_and_never_cached(tmp_path: Path) -> None:
    kernel = Toy(heuristic=Cfg(reps=4))
    chain, rec = make_chain(tmp_path, AutotunePolicy(autotune=False))
    inv = invocation(kernel)
    assert chain.choose(inv, kernel) == Cfg(reps=4)
    assert chain.choose(inv, kernel) == Cfg(reps=4)
    assert rec.tiers == ["heuristic", "heuristic"]
    assert chain.cache.size() == 0
    assert not cache_file(tmp_path).exists()
    assert kernel.tuning_shapes == []
    # A later autotuning run still happens: heuristics never mask the tuner.
    tuned, rec2 = make_chain(tmp_path, cache=chain.cache)
    assert tuned.choose(inv, kernel) == FAST
    assert rec2.tiers == ["autotune"]


def test_heuristic_used_when_kernel_has_no_candidates(tmp_path: Path) -> None:
    kernel = Toy(candidates=())
    chain, rec = make_chain(tmp_path)
    assert chain.choose(invocation(kernel), kernel) == Cfg(reps=2)
    assert rec.tiers == ["heuristic"]


def test_error_when_nothing_produces_a_config(tmp_path: Path) -> None:
    kernel = Toy(candidates=(), heuristic=None)
    chain, rec = make_chain(tmp_path, AutotunePolicy(autotune=False))
    with pytest.raises(ConfigSelectionError, match="toy@1") as excinfo:
        chain.choose(invocation(kernel), kernel)
    message = str(excinfo.value)
    assert "Pass cfg= explicitly" in message and "EJK_AUTOTUNE=1" in message
    assert isinstance(excinfo.value, ejk.EjkError) and isinstance(excinfo.value, RuntimeError)
    assert rec.tiers == []


def test_error_lists_why_every_candidate_failed(tmp_path: Path) -> None:
    kernel = Toy(candidates=(BOOM, NAN), heuristic=None)
    chain, _ = make_chain(tmp_path)
    with pytest.raises(ConfigSelectionError) as excinfo:
        chain.choose(invocation(kernel), kernel)
    message = str(excinfo.value)
    assert "this candidate does not lower" in message
    assert "produced NaN or infinite values" in message


def test_clear_memory(tmp_path: Path) -> None:
    kernel = Toy()
    chain, rec = make_chain(tmp_path, persist=False)
    inv = invocation(kernel)
    chain.cache.put(*inv.cache_key, Cfg(reps=9))
    chain.clear_memory()
    assert chain.cache.size() == 0
    assert chain.choose(inv, kernel) == FAST
    assert rec.tiers == ["autotune"]


def test_events_are_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    kernel = Toy()
    chain, _ = make_chain(tmp_path, AutotunePolicy(autotune=False))
    with caplog.at_level("DEBUG", logger="ejk.selection"):
        chain.choose(invocation(kernel), kernel)
    assert any("toy@1" in r.getMessage() and "heuristic" in r.getMessage() for r in caplog.records)
