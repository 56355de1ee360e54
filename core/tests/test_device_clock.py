"""``AutotunePolicy(clock="device")``: samples timed on the GPU's own timeline, the wall clock where none."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from ejk import AutotunePolicy
from ejk.config import _device_clock, tuning


def plane(name: str, *lines: list[tuple[int, int]]) -> Any:
    """A trace plane of ``(start_ns, duration_ns)`` events per line, shaped like ``ProfileData.planes``."""
    return SimpleNamespace(name=name, lines=[SimpleNamespace(events=[SimpleNamespace(start_ns=s, duration_ns=d)
                                                                     for s, d in line]) for line in lines])


def test_the_span_covers_every_gpu_event_and_nothing_else() -> None:
    planes = [plane("/host:CPU", [(0, 10_000)]),  # host time: ignored
              plane("/device:GPU:0", [(1_000, 300), (1_400, 300)], [(1_200, 900)]),
              plane("/device:GPU:1", [])]
    assert _device_clock.gpu_span_ns(planes) == 2_100 - 1_000
    assert [start for _, start, _ in _device_clock.gpu_events(planes)] == [1_000, 1_200, 1_400]  # start order
    assert _device_clock.gpu_span_ns([plane("/host:CPU", [(0, 5)])]) is None


def test_no_gpu_activity_reads_as_no_timeline() -> None:
    x = jnp.ones((8, 8))
    run = jax.jit(lambda a: a @ a)
    assert _device_clock.device_seconds_per_call(lambda: run(x), 3) is None  # a CPU records none


def test_a_running_profiler_session_falls_back_with_one_warning(tmp_path: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_device_clock, "_warned_busy", False)
    x = jnp.ones((4,))
    jax.profiler.start_trace(str(tmp_path))
    try:
        with pytest.warns(RuntimeWarning, match="wall clock"):
            assert _device_clock.device_seconds_per_call(lambda: x + 1, 2) is None
        assert _device_clock.device_seconds_per_call(lambda: x + 1, 2) is None  # warned once only
    finally:
        jax.profiler.stop_trace()


def test_measure_uses_the_device_clock_where_it_reads_and_the_wall_clock_where_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x = jnp.ones((4,))
    policy = AutotunePolicy(warmup=0, repeats=3, calls_per_sample=5, clock="device")
    seen: list[int] = []

    def on_device(call: Any, calls: int, *, busy: bool = False) -> float:
        seen.append(calls)
        return 2e-6

    monkeypatch.setattr(tuning, "device_seconds_per_call", on_device)
    assert tuning._clock_kind(policy) == "wall"  # no GPU here: not even a trace is tried
    monkeypatch.setattr(tuning, "_clock_kind", lambda policy: policy.clock)  # as on a GPU
    assert tuning.measure(lambda: x + 1, policy) == (5, (2e-6, 2e-6, 2e-6))
    assert seen == [5, 5, 5]
    monkeypatch.setattr(tuning, "device_seconds_per_call", lambda call, calls, busy=False: None)
    calls, times = tuning.measure(lambda: x + 1, policy)
    assert calls == 5 and len(times) == 3 and all(t > 0 for t in times)  # timed by the wall clock
    monkeypatch.setattr(tuning, "device_seconds_per_call", on_device)
    tuning.measure(lambda: x + 1, AutotunePolicy(warmup=0, repeats=2, calls_per_sample=5))
    assert seen == [5, 5, 5]  # the default wall clock never traces


def test_the_clock_is_validated() -> None:
    assert AutotunePolicy().clock == "wall"
    with pytest.raises(ValueError, match="clock"):
        AutotunePolicy(clock="gpu")


def test_ejk_bench_passes_the_clock_to_its_timing_policy() -> None:
    from ejk import _bench_cli
    from ejk.cli import build_parser

    assert _bench_cli._options(build_parser().parse_args(["bench", "--quick"])).policy.clock == "wall"
    assert _bench_cli._options(build_parser().parse_args(["bench", "--clock", "device"])).policy.clock == "device"


def test_busy_time_is_the_union_of_the_gpu_activities() -> None:
    """``clock="busy"`` counts the time some activity runs: overlaps (several streams) once, gaps not at all."""
    events = [("a", 1_000, 1_300), ("b", 1_200, 2_100), ("c", 1_400, 1_700),  # b covers c; a and b overlap
              ("d", 5_000, 5_500),  # after a gap
              ("e", 5_500, 5_600)]  # abutting
    assert _device_clock.events_busy_ns(events) == (2_100 - 1_000) + (5_600 - 5_000)
    assert _device_clock.events_span_ns(events) == 5_600 - 1_000
    assert _device_clock.events_busy_ns([]) is None


def test_the_busy_clock_reads_the_same_trace_without_its_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    traced: list[int] = []

    def trace(call: Any, calls: int) -> list[tuple[str, int, int]]:
        traced.append(calls)
        return [("k", 0, 10_000), ("k", 40_000, 50_000)]  # two 10 µs kernels, 30 µs of host dispatch between

    monkeypatch.setattr(_device_clock, "trace_gpu_events", trace)
    assert _device_clock.device_seconds_per_call(lambda: None, 2) == pytest.approx(25e-6)
    assert _device_clock.device_seconds_per_call(lambda: None, 2, busy=True) == pytest.approx(10e-6)
    assert traced == [2, 2]
    seen: list[bool] = []

    def on_device(call: Any, calls: int, *, busy: bool = False) -> float:
        seen.append(busy)
        return 1e-6

    monkeypatch.setattr(tuning, "device_seconds_per_call", on_device)
    monkeypatch.setattr(tuning, "_clock_kind", lambda policy: policy.clock)  # as on a GPU
    x = jnp.ones((4,))
    for clock in ("device", "busy"):
        policy = AutotunePolicy(warmup=0, repeats=2, calls_per_sample=3, clock=clock)
        assert tuning.measure(lambda: x + 1, policy) == (3, (1e-6, 1e-6))
    assert seen == [False, False, True, True]


def test_ejk_bench_takes_the_busy_clock() -> None:
    from ejk import _bench_cli
    from ejk.cli import build_parser

    assert _bench_cli._options(build_parser().parse_args(["bench", "--clock", "busy"])).policy.clock == "busy"
