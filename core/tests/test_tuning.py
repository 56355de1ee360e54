"""The autotuner: parallel compiles, budget, pruning, output checks, looped timing, policy mode."""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.testing
from ejk import AutotunePolicy, Invocation, Kernel, autotune
from ejk.config import tuning
from ejk.execution.kernel import make_call_key


@attrs.frozen
class Work:
    """``n`` chained matmuls whose result is discarded; ``kind`` makes a candidate wrong on purpose."""

    n: int
    kind: str = "ok"
    sleep: float = 0.0


def _burn(x: jax.Array, times: int) -> jax.Array:
    w = jnp.eye(x.shape[-1], dtype=x.dtype) * 0.5
    return jax.lax.fori_loop(0, times, lambda i, y: jnp.tanh(y @ w) * 2.0, x)


class Scaled(Kernel[Work, Any]):
    """y = 2x for every correct candidate; the cost grows with ``cfg.n``. Records each trace."""

    op_id = "scaled"
    cfg_type = Work

    def __init__(self, candidates: tuple[Work, ...], heuristic: Work | None = None,
                 prune: Any = None) -> None:
        self.candidates = candidates
        self.heuristic = heuristic
        self.prune = prune
        self.traced: list[Work] = []
        self._lock = threading.Lock()

    def run(self, x: jax.Array, *, cfg: Work) -> Any:
        with self._lock:
            self.traced.append(cfg)
        if cfg.sleep:
            time.sleep(cfg.sleep)  # a slow compile
        y = 2.0 * x + 0.0 * _burn(x, cfg.n).sum()
        if cfg.kind == "transposed":
            return y.T
        if cfg.kind == "half":
            return y.astype(jnp.float16)
        if cfg.kind == "tuple":
            return (y,)
        if cfg.kind == "nan":
            return y * jnp.nan
        if cfg.kind == "off":
            return y * 1.01 + 0.5
        if cfg.kind == "bf16_noise":  # another summation order: equal within bf16 tolerance
            return (x.astype(jnp.float32) * 2.0 + 1e-3 * jnp.sin(x.astype(jnp.float32))).astype(x.dtype)
        return y

    def heuristic_cfg(self, inv: Invocation[Work]) -> Work | None:
        return self.heuristic

    def candidate_cfgs(self, inv: Invocation[Work]) -> tuple[Work, ...]:
        return self.candidates

    def prune_reason(self, inv: Invocation[Work], cfg: Work) -> str | None:
        return self.prune(cfg) if self.prune is not None else None


def invocation(x: jax.Array) -> Invocation[Work]:
    return Invocation(op_id="scaled", version="1", args=(x,), kwargs={}, call_key=make_call_key("scaled@1", (x,), {}),
                      device="cpu")


X = jnp.asarray(np.random.default_rng(0).standard_normal((96, 96)), jnp.float32)
FAST = Work(1)
QUICK = dict(warmup=0, repeats=2, progress=False, min_sample_seconds=0.0005, max_calls_per_sample=8)


# -- parallel compilation -------------------------------------------------------------------------


def test_parallel_compile_picks_the_same_winner_as_serial() -> None:
    candidates = (Work(150), FAST, Work(100), Work(200))  # FAST costs ~1/50 of the next one
    results = []
    for workers in (1, 3):
        kernel = Scaled(candidates)
        policy = AutotunePolicy(compile_workers=workers, repeats=5, progress=False, min_sample_seconds=0.002,
                                max_calls_per_sample=64)  # the median of 5 shrugs off a preempted sample
        result = autotune(kernel, invocation(X), candidates, policy)
        assert [t.cfg for t in result.trials] == list(candidates)  # reported in the kernel's order
        assert all(t.status == "timed" and t.compile_seconds is not None for t in result.trials)
        assert sorted(kernel.traced, key=lambda w: w.n) == sorted(candidates, key=lambda w: w.n)  # each once
        assert result.compile_workers == workers and result.compile_wall_seconds is not None
        results.append(result)
    assert results[0].best == results[1].best == FAST
    assert results[1].describe().startswith("4 candidates: 4 timed, 0 failed, 0 pruned, 0 over budget in ")
    assert results[1].describe().endswith(", 3 workers)")
    assert "1 worker)" in results[0].describe()


def test_default_compile_workers() -> None:
    assert 1 <= AutotunePolicy().compile_workers <= 4
    with pytest.raises(ValueError):
        AutotunePolicy(compile_workers=0)


# -- budget ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_max_seconds_stops_tuning_and_keeps_the_baseline(workers: int) -> None:
    slow = tuple(Work(1 + i, sleep=0.25) for i in range(8))
    heuristic = slow[5]
    kernel = Scaled(slow, heuristic=heuristic)
    policy = AutotunePolicy(max_seconds=0.4, compile_workers=workers, check_outputs=True, **QUICK)
    result = autotune(kernel, invocation(X), slow, policy)
    assert len(kernel.traced) < len(slow)  # 8 compiles of 0.25 s never fit in 0.4 s
    assert result.over_budget >= 1 and result.over_budget + result.timed == len(slow)
    skipped = [t for t in result.trials if t.status == "budget"]
    assert all(t.error is not None and "budget of 0.4s" in t.error for t in skipped)
    assert result.trials[5].status == "timed"  # the heuristic candidate is always compiled and timed first
    assert heuristic in kernel.traced[:workers]  # started first (threads may append in either order)
    assert result.best is not None
    assert f"{result.over_budget} over budget" in result.describe()


def test_max_candidates_and_budget_validation() -> None:
    with pytest.raises(ValueError):
        AutotunePolicy(max_seconds=0)
    kernel = Scaled((Work(3), FAST, Work(2)))
    result = autotune(kernel, invocation(X), kernel.candidates, AutotunePolicy(max_candidates=2, **QUICK))
    assert [t.cfg for t in result.trials] == [Work(3), FAST]


# -- pruning --------------------------------------------------------------------------------------


def test_pruned_candidates_are_never_compiled() -> None:
    candidates = tuple(Work(n) for n in range(1, 7))
    kernel = Scaled(candidates, prune=lambda cfg: f"n={cfg.n} is odd" if cfg.n % 2 else None)
    result = autotune(kernel, invocation(X), candidates, AutotunePolicy(compile_workers=2, **QUICK))
    assert set(kernel.traced) == {Work(2), Work(4), Work(6)}
    assert result.pruned == 3 and result.timed == 3 and result.failed == 0
    pruned = [t for t in result.trials if t.status == "pruned"]
    assert [t.error for t in pruned] == ["pruned: n=1 is odd", "pruned: n=3 is odd", "pruned: n=5 is odd"]
    assert result.best in {Work(2), Work(4), Work(6)}
    summary = result.summary(repr)
    assert [s["status"] for s in summary] == ["pruned", "timed"] * 3


def test_everything_pruned_compiles_nothing() -> None:
    kernel = Scaled((FAST, Work(2)), prune=lambda cfg: "no")
    result = autotune(kernel, invocation(X), kernel.candidates, AutotunePolicy(**QUICK))
    assert result.best is None and kernel.traced == [] and result.pruned == 2


# -- output checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "message"), [
    ("transposed", "output shape or dtype differs from the baseline candidate: got float32[64, 96]"),
    ("half", "output shape or dtype differs from the baseline candidate: got float16[96, 64]"),
    ("tuple", "output structure differs from the baseline candidate"),
    ("off", "output differs from the baseline candidate: max abs err"),
])
def test_a_wrong_candidate_never_wins_even_when_fastest(kind: str, message: str) -> None:
    x = X[:, :64]
    baseline, wrong = Work(40), Work(0, kind=kind)  # the wrong one does no extra work at all
    kernel = Scaled((wrong, baseline), heuristic=baseline)
    result = autotune(kernel, invocation(x), kernel.candidates, AutotunePolicy(**QUICK))
    trials = {t.cfg: t for t in result.trials}
    assert trials[wrong].status == "failed" and trials[wrong].seconds is None
    assert trials[wrong].error is not None and trials[wrong].error.startswith(message)
    assert result.best == baseline and trials[baseline].status == "timed"
    assert result.failed == 1


def test_value_error_names_error_and_tolerance() -> None:
    kernel = Scaled((FAST, Work(0, kind="off")))
    inv = invocation(X)
    result = autotune(kernel, inv, kernel.candidates, AutotunePolicy(**QUICK))
    error = result.trials[1].error
    assert error is not None
    x = np.asarray(kernel.tuning_args(inv)[0])  # what the tuner ran on
    scale = max(float(np.median(np.abs(2 * x))), 1.0)  # the outputs' typical magnitude
    want = float(np.max(np.abs(x * 2 * 0.01 + 0.5)))
    assert error == (f"output differs from the baseline candidate: max abs err {want:.3g} "
                     f"(tolerance {1e-4 * scale:.3g})")


class Exp3(Scaled):
    """y = exp(3x): outputs spanning many orders of magnitude."""

    def run(self, x: jax.Array, *, cfg: Work) -> Any:
        y = jnp.exp(3.0 * x) + 0.0 * _burn(x, cfg.n).sum()
        return jnp.where(y < 0.3, 0.0, y) if cfg.kind == "zero_small" else y


def test_a_candidate_zeroing_the_small_outputs_never_wins() -> None:
    baseline, wrong = Work(40), Work(0, kind="zero_small")  # zeroes a third of the outputs, and is fastest
    kernel = Exp3((wrong, baseline), heuristic=baseline)
    result = autotune(kernel, invocation(X[:, :64]), kernel.candidates, AutotunePolicy(**QUICK))
    trials = {t.cfg: t for t in result.trials}
    assert trials[wrong].status == "failed", "the elementwise check must see the zeroed outputs"
    assert trials[wrong].error is not None and trials[wrong].error.startswith("output differs from the baseline")
    assert result.best == baseline


def test_bf16_candidates_agree_within_the_loose_tolerance() -> None:
    x = X.astype(jnp.bfloat16)
    kernel = Scaled((FAST, Work(0, kind="bf16_noise")))
    result = autotune(kernel, invocation(x), kernel.candidates, AutotunePolicy(**QUICK))
    assert [t.status for t in result.trials] == ["timed", "timed"]


def test_output_check_can_be_turned_off() -> None:
    kernel = Scaled((FAST, Work(0, kind="off")))
    result = autotune(kernel, invocation(X), kernel.candidates, AutotunePolicy(check_outputs=False, **QUICK))
    assert [t.status for t in result.trials] == ["timed", "timed"]


def test_a_failing_baseline_hands_the_reference_to_the_next_candidate() -> None:
    kernel = Scaled((Work(0, kind="nan"), FAST, Work(0, kind="off")), heuristic=None)
    result = autotune(kernel, invocation(X), kernel.candidates, AutotunePolicy(**QUICK))
    assert [t.status for t in result.trials] == ["failed", "timed", "failed"]
    assert result.trials[0].error == "produced NaN or infinite values"
    assert result.best == FAST


def test_tolerances_follow_the_testing_table() -> None:
    assert tuning.tolerance(jnp.bfloat16) == ejk.testing.TOLERANCES["bfloat16"]
    assert tuning.tolerance(jnp.float32) == (1e-4, 1e-4)
    assert tuning.tolerance(jnp.int32) is None


# -- timing ---------------------------------------------------------------------------------------


def test_each_sample_loops_over_the_executable(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    class Counted(Scaled):
        def run(self, x: jax.Array, *, cfg: Work) -> Any:
            jax.debug.callback(lambda _: calls.append(1), x)  # an operand: not run at trace time
            return super().run(x, cfg=cfg)

    kernel = Counted((FAST,))
    policy = AutotunePolicy(warmup=0, repeats=3, calls_per_sample=7, progress=False)
    result = autotune(kernel, invocation(X), kernel.candidates, policy)
    (trial,) = result.trials
    assert trial.calls_per_sample == 7 and len(trial.times) == 3
    assert len(calls) == 1 + 3 * 7  # one checked run, then 3 samples of 7 calls


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_calls_per_sample_adapts_to_the_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(tuning, "_clock", clock)
    out = jnp.zeros(())

    def call() -> jax.Array:
        clock.now += 1e-5  # a 10 µs kernel
        return out

    assert tuning._calls_per_sample(call, AutotunePolicy(min_sample_seconds=0.005)) == 500
    assert tuning._calls_per_sample(call, AutotunePolicy(min_sample_seconds=0.005, max_calls_per_sample=64)) == 64
    assert tuning._calls_per_sample(call, AutotunePolicy(min_sample_seconds=1e-6)) == 1
    assert tuning._sample(call, 40) == pytest.approx(1e-5)


def test_spread_is_reported() -> None:
    trial = tuning.Trial(cfg=FAST, seconds=2.0, times=(1.0, 2.0, 3.0, 10.0))
    assert (trial.min_seconds, trial.max_seconds, trial.status) == (1.0, 10.0, "timed")
    assert trial.iqr_seconds == pytest.approx(4.75 - 1.75)
    result = tuning.TuneResult(best=FAST, trials=(trial,))
    (entry,) = result.summary(repr)
    assert entry["min_s"] == 1.0 and entry["max_s"] == 10.0 and entry["median_s"] == 2.0
    assert entry["status"] == "timed" and entry["calls_per_sample"] == 1


def test_l2_flush_is_off_on_cpu_and_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tuning._make_flusher(AutotunePolicy(), (X,)) is None
    flushes: list[int] = []
    real = tuning._L2Flusher.__call__

    def counted(self: Any) -> None:
        flushes.append(1)
        real(self)

    monkeypatch.setattr(tuning._L2Flusher, "__call__", counted)
    kernel = Scaled((FAST, Work(2)))
    policy = AutotunePolicy(flush_l2=True, l2_flush_bytes=1 << 20, **QUICK)
    result = autotune(kernel, invocation(X), kernel.candidates, policy)
    assert result.timed == 2
    assert len(flushes) == 2 * policy.repeats  # once before each sample


# -- policy mode ----------------------------------------------------------------------------------


def test_explicit_mode_and_autotune_flag_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_AUTOTUNE", "frozen")
    assert AutotunePolicy(mode="heuristics", autotune=True).effective_mode() == "heuristics"
    assert AutotunePolicy(autotune=True).effective_mode() == "autotune"
    assert AutotunePolicy(autotune=False).effective_mode() == "heuristics"
    assert AutotunePolicy().effective_mode() == "frozen"
    assert AutotunePolicy(mode="autotune").enabled() and not AutotunePolicy(mode="frozen").enabled()
    with pytest.raises(ValueError):
        AutotunePolicy(mode="fast")


@pytest.mark.parametrize(("value", "mode"), [
    *((v, "autotune") for v in ("1", "true", "YES", "on", "autotune", " Autotune ")),
    *((v, "heuristics") for v in ("0", "false", "no", "off", "heuristics", "")),
    ("frozen", "frozen"),
])
def test_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, mode: str) -> None:
    monkeypatch.setenv("EJK_AUTOTUNE", value)
    assert AutotunePolicy().effective_mode() == mode
    assert AutotunePolicy().enabled() == (mode == "autotune")


def test_mode_defaults_to_heuristics_and_rejects_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EJK_AUTOTUNE", raising=False)
    assert AutotunePolicy().effective_mode() == "heuristics"
    monkeypatch.setenv("EJK_AUTOTUNE", "sometimes")
    with pytest.raises(ValueError, match=r"EJK_AUTOTUNE='sometimes'.*autotune.*heuristics.*frozen"):
        AutotunePolicy().effective_mode()


def test_output_checks_work_when_tuning_inside_jit() -> None:
    kernel = Scaled((Work(0, kind="off"), FAST, Work(0, kind="transposed")), heuristic=FAST)
    events: list[ejk.SelectionEvent] = []
    chain = ejk.ConfigSelectorChain(policy=AutotunePolicy(mode="autotune", **QUICK), on_event=events.append,
                                    persist=False, plugin_host=False)
    executor = ejk.Executor(chain)
    out = jax.jit(lambda x: executor(kernel, x) + 1.0)(X)
    np.testing.assert_allclose(out, 2.0 * np.asarray(X) + 1.0, rtol=1e-6)
    (event,) = events
    assert event.tier == "autotune" and event.cfg == FAST and event.tune is not None
    assert [t.status for t in event.tune.trials] == ["failed", "timed", "failed"]
