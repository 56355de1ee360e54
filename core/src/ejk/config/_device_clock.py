"""Per-call time on the GPU's own timeline, for ``AutotunePolicy(clock="device")`` and ``clock="busy"``.

A timed sample runs inside its own ``jax.profiler`` trace, read back with
``jax.profiler.ProfileData``. With ``"device"`` its time is the span from the first GPU activity's
start to the last one's end, over the sample's calls: gaps between calls count, host time the
device never waits for does not. The wall clock counts such host time. jax-triton's launch, for
one, was seen waiting on the host (benchmarks/results/kernel_defaults_h100.md). With ``"busy"``
it is the time some GPU activity runs (the union of the activities' intervals): the gaps are left
out too. That is the kernels' own time, what a call costs inside a larger jitted program or a CUDA
graph, where nothing waits for the host between calls; it is the one to read for calls shorter than
the host's dispatch of a jitted call (tens of µs), whose spans measure that dispatch.

Where no timeline can be read the caller times the sample by the wall clock instead:
- no GPU activity was recorded (a CPU, or a jax without ``ProfileData``);
- a profiler session of the user's is already running (a warning says so, once).
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax

__all__ = ["device_seconds_per_call", "events_busy_ns", "events_span_ns", "gpu_events", "gpu_span_ns",
           "trace_gpu_events"]

_GPU_PLANE = "/device:GPU"
_warned_busy = False


def gpu_events(planes: Iterable[Any]) -> list[tuple[str, int, int]]:
    """``(name, start ns, end ns)`` of every GPU activity in a trace's planes, in start order.

    ``planes`` are a trace's planes (``ProfileData.planes``): each has a ``name`` and ``lines``
    of ``events`` with ``name``, ``start_ns`` and ``duration_ns``; only planes named
    ``/device:GPU…`` count.
    """
    events = [(str(getattr(event, "name", "")), int(event.start_ns), int(event.start_ns + event.duration_ns))
              for plane in planes if plane.name.startswith(_GPU_PLANE) for line in plane.lines
              for event in line.events]
    return sorted(events, key=lambda event: event[1])


def events_span_ns(events: list[tuple[str, int, int]]) -> int | None:
    """Nanoseconds from the first of :func:`gpu_events`' starts to the last end, or ``None`` if none."""
    if not events:
        return None
    return max(end for _, _, end in events) - events[0][1]


def events_busy_ns(events: list[tuple[str, int, int]]) -> int | None:
    """Nanoseconds during which at least one of :func:`gpu_events` runs (their intervals' union: activities that
    overlap, on several streams, count once), or ``None`` if none."""
    if not events:
        return None
    busy, reach = 0, None
    for _, start, end in events:  # in start order
        if reach is None or start > reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    return busy


def gpu_span_ns(planes: Iterable[Any]) -> int | None:
    """Nanoseconds from the first GPU activity's start to the last one's end, or ``None`` if none."""
    return events_span_ns(gpu_events(planes))


def trace_gpu_events(call: Callable[[], Any], calls: int) -> list[tuple[str, int, int]] | None:
    """``(name, start ns, end ns)`` of every GPU activity (kernels, copies) during ``calls`` back-to-back calls
    of ``call`` (outputs dropped as they come), in start order: :func:`gpu_events` of a profiler trace.

    Returns ``None`` where no trace can be taken: no ``jax.profiler.ProfileData`` in this jax, or
    a profiler session already running (warned once). An empty list: no GPU activity recorded.
    """
    global _warned_busy
    try:
        from jax.profiler import ProfileData
    except ImportError:  # pragma: no cover - jax before ProfileData
        return None
    trace_dir = tempfile.mkdtemp(prefix="ejk-device-clock-")
    try:
        try:
            jax.profiler.start_trace(trace_dir)
        except RuntimeError as exc:  # one profiler session at a time: the user's own is running
            if not _warned_busy:
                _warned_busy = True
                warnings.warn(f"ejk: clock='device' timed by the wall clock instead ({exc})", RuntimeWarning,
                              stacklevel=3)
            return None
        try:
            out = None
            for _ in range(calls):
                out = call()
            jax.block_until_ready(out)
        finally:
            jax.profiler.stop_trace()
        traces = list(Path(trace_dir).rglob("*.xplane.pb"))
        return gpu_events(ProfileData.from_file(str(traces[0])).planes) if len(traces) == 1 else None
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def device_seconds_per_call(call: Callable[[], Any], calls: int, *, busy: bool = False) -> float | None:
    """Seconds per call of ``calls`` back-to-back calls of ``call`` on the GPU's timeline: the span
    of :func:`trace_gpu_events` over ``calls`` (``busy``: the time the GPU was busy, :func:`events_busy_ns`);
    ``None`` where there is none to read."""
    events = trace_gpu_events(call, calls) or []
    span = events_busy_ns(events) if busy else events_span_ns(events)
    return None if span is None else span / max(calls, 1) / 1e9
