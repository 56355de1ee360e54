"""``ejk bench``: every implementation of an op against the best external baselines, in one run.

For each case (an op at one shape) and mode (``fwd``, ``fwd+bwd``), every registered
implementation that can run here is timed through the public op (its platform and
implementation forced), ``platform="auto"`` is timed as ejk would choose, optionally each
implementation's best config, and the external baselines of :data:`BASELINES` — all in the same
process on the same inputs. The result is a list of :class:`Measurement` (TFLOP/s or GB/s,
the ratio to the best baseline, the fraction of the device's peak, compile time, median and
spread), written as a table, a JSON file, a markdown summary and PNG plots::

    from ejk import bench
    found = bench.run(bench.parse_shapes(["attention:4x4096x16x128:causal"]), bench.Options(modes=("fwd",)))
"""

from __future__ import annotations

from ejk.bench import _fla  # noqa: F401  (registers the fla baselines of the recurrent ops)
from ejk.bench._baselines import BASELINES, Baseline, Prepared, baselines_for, register_baseline
from ejk.bench._cases import (
    PRESETS,
    QUICK,
    AttentionCase,
    Case,
    MatmulCase,
    MlaCase,
    MoeCase,
    PagedCase,
    parse_case,
    parse_shapes,
    resolve_op,
)
from ejk.bench._eager_split import EAGER_MEASURES, eager_split
from ejk.bench._environment import environment
from ejk.bench._peaks import PEAKS, Peak, peak_for
from ejk.bench._runner import Measurement, Options, run
from ejk.bench._ssd_baseline import mamba2_chunked
from ejk.bench._workloads import MODES, Workload, workload_for
from ejk.config._device_clock import device_seconds_per_call, trace_gpu_events

__all__ = [
    "BASELINES",
    "EAGER_MEASURES",
    "MODES",
    "PEAKS",
    "PRESETS",
    "QUICK",
    "AttentionCase",
    "Baseline",
    "Case",
    "MatmulCase",
    "Measurement",
    "MlaCase",
    "MoeCase",
    "Options",
    "PagedCase",
    "Peak",
    "Prepared",
    "Workload",
    "baselines_for",
    "device_seconds_per_call",
    "eager_split",
    "mamba2_chunked",
    "environment",
    "parse_case",
    "parse_shapes",
    "peak_for",
    "register_baseline",
    "resolve_op",
    "run",
    "trace_gpu_events",
    "workload_for",
]
