"""Autotuning: time each candidate config's *compiled executable* on representative inputs.

Never times tracing or compilation. The steps, per call of :func:`autotune`:

1. Prune: :meth:`~ejk.Kernel.prune_reason` rules candidates out before anything is compiled.
2. Compile the rest in parallel threads (``AutotunePolicy.compile_workers``; XLA's compiler
   releases the GIL), the *baseline* candidate first: the kernel's heuristic config when it is
   among the candidates, else the first candidate. It is always compiled and timed, so a
   tuning run cut short by its budget still has an answer.
3. Time the compiled candidates one at a time, the baseline first. A first run's output is
   checked (pytree structure, shapes and dtypes against the baseline's abstract output;
   finiteness; values elementwise against the baseline's output within the dtype's tolerance). Then, after
   warm-up, each of ``repeats`` samples times a loop of N back-to-back calls and blocks only at
   its end, N chosen so that a sample lasts at least ``min_sample_seconds``: dispatch and
   synchronisation are amortised over the loop, which is what makes 10 µs GPU kernels
   measurable. On GPUs the L2 cache is flushed before each sample. The median wins.

A candidate that fails to compile or run, or whose output fails a check, is kept with the
reason and cannot win. ``AutotunePolicy.max_seconds`` bounds the wall time: no new candidate is
started once it is spent (the baseline always is).
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import jax
import numpy as np

from ejk import environment
from ejk.config._device_clock import device_seconds_per_call
from ejk.execution.kernel import bind_kernel
from ejk.tolerances import TOLERANCES

if TYPE_CHECKING:
    from ejk.execution.kernel import Invocation, Kernel

__all__ = ["AutotunePolicy", "Trial", "TuneResult", "autotune", "l2_flusher", "measure"]

Cfg = TypeVar("Cfg")
OBJECTIVES = ("forward", "forward_backward")
#: How a sample is timed, see :attr:`AutotunePolicy.clock`.
CLOCKS = ("wall", "device", "busy")
#: The config policies on a cache miss, see :meth:`AutotunePolicy.effective_mode`.
MODES = environment.AUTOTUNE_MODES
#: Trial outcomes: timed, failed (compile, run or a check), pruned by the kernel, skipped by the budget.
STATUSES = ("timed", "failed", "pruned", "budget")
#: The smallest absolute and relative tolerance of the output check (summation order differs by config).
TOLERANCE_FLOOR = 1e-4
_GPU_PLATFORMS = ("gpu", "cuda", "rocm")
#: The clock of every measurement and of the budget (tests replace it).
_clock: Callable[[], float] = time.perf_counter


def _default_compile_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@attrs.frozen(kw_only=True)
class AutotunePolicy:
    """When and how to autotune.

    Attributes:
        autotune: ``True``/``False``; ``None`` follows ``EJK_AUTOTUNE`` (default off).
        mode: ``"autotune"``, ``"heuristics"`` or ``"frozen"`` (a cache miss raises); overrides
            ``autotune`` and the environment. See :meth:`effective_mode`.
        warmup: Untimed runs of each compiled candidate (besides the run whose output is checked).
        repeats: Timed samples; the median counts.
        max_candidates: Try at most this many candidates (in the kernel's order).
        max_seconds: Wall-clock budget of one tuning run; once spent, no new candidate is compiled
            or timed and the best so far wins (the baseline candidate is always tried).
        compile_workers: Threads compiling candidates at once (1: serially, in the calling thread).
        min_sample_seconds: A timed sample loops over the executable until it lasts about this long.
        max_calls_per_sample: At most this many calls in one sample's loop.
        calls_per_sample: Exactly this many calls per sample (``None``: chosen per candidate).
        flush_l2: Flush the device's L2 cache before each sample; ``None`` flushes on GPUs only.
        l2_flush_bytes: Size of the buffer written to flush L2 (at least twice the L2 size).
        persist: Write the winner to the persistent cache.
        progress: Show a progress bar; ``None`` shows one on a terminal for 4+ candidates.
        check_finite: Reject candidates whose output has NaN or infinity.
        check_outputs: Reject candidates whose output structure, shapes, dtypes or values differ
            from the baseline candidate's (values within the dtype's tolerance).
        objective: ``"forward"`` times the output alone; ``"forward_backward"`` times the output
            plus its VJP with respect to every floating-point input (for training, where the
            backward pass dominates). The objective is recorded with each persisted config.
        clock: ``"wall"`` times a sample by the host's clock; ``"device"`` by the GPU's own
            timeline, one ``jax.profiler`` trace per sample, leaving out host time the device
            never waits for (a slow launch path such as jax-triton's). It falls back to the
            wall clock where no timeline can be read: no GPU, or a profiler session already
            running. Opt-in: each trace costs host time. ``"busy"``: the same trace, counting only
            the time the GPU runs something (gaps between calls left out): the kernels' own time,
            as inside a larger program, for calls shorter than the host's dispatch of one.
    """

    autotune: bool | None = None
    mode: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.in_(MODES)))
    warmup: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    repeats: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    max_candidates: int | None = None
    max_seconds: float | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.gt(0)))
    compile_workers: int = attrs.field(factory=_default_compile_workers, validator=attrs.validators.ge(1))
    min_sample_seconds: float = attrs.field(default=0.005, validator=attrs.validators.ge(0))
    max_calls_per_sample: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    calls_per_sample: int | None = attrs.field(default=None,
                                               validator=attrs.validators.optional(attrs.validators.ge(1)))
    flush_l2: bool | None = None
    l2_flush_bytes: int = attrs.field(default=256 * 2**20, validator=attrs.validators.ge(0))
    persist: bool = True
    progress: bool | None = None
    check_finite: bool = True
    check_outputs: bool = True
    objective: str = attrs.field(default="forward", validator=attrs.validators.in_(OBJECTIVES))
    clock: str = attrs.field(default="wall", validator=attrs.validators.in_(CLOCKS))

    def effective_mode(self) -> str:
        """The policy on a cache miss: ``"autotune"``, ``"heuristics"`` or ``"frozen"``.

        An explicit :attr:`mode` wins; else :attr:`autotune` (``True``: ``"autotune"``,
        ``False``: ``"heuristics"``); else the ``EJK_AUTOTUNE`` environment variable.

        Raises:
            ValueError: when ``EJK_AUTOTUNE`` is consulted and holds an unknown value.
        """
        if self.mode is not None:
            return self.mode
        if self.autotune is not None:
            return "autotune" if self.autotune else "heuristics"
        return environment.autotune_mode()

    def enabled(self) -> bool:
        """Whether a cache miss autotunes."""
        return self.effective_mode() == "autotune"


def _default_status(trial: Trial[Any]) -> str:
    return "timed" if trial.seconds is not None else "failed"


@attrs.frozen(kw_only=True)
class Trial(Generic[Cfg]):
    """One candidate's outcome: median seconds per call, or the reason it cannot win.

    Attributes:
        cfg: The candidate.
        seconds: Median seconds per call over the samples (``None`` unless timed).
        times: Seconds per call of each sample.
        calls_per_sample: Back-to-back calls timed in each sample.
        compile_seconds: Lowering plus compilation time (in a worker thread when parallel).
        error: Why it was not timed or cannot win.
        status: ``"timed"``, ``"failed"``, ``"pruned"`` or ``"budget"`` (skipped by ``max_seconds``).
    """

    cfg: Cfg = attrs.field(eq=False)
    seconds: float | None = None
    times: tuple[float, ...] = ()
    calls_per_sample: int = 1
    compile_seconds: float | None = None
    error: str | None = None
    status: str = attrs.field(default=attrs.Factory(_default_status, takes_self=True),
                              validator=attrs.validators.in_(STATUSES))

    @property
    def min_seconds(self) -> float | None:
        """The fastest sample's seconds per call."""
        return min(self.times) if self.times else None

    @property
    def max_seconds(self) -> float | None:
        """The slowest sample's seconds per call."""
        return max(self.times) if self.times else None

    @property
    def iqr_seconds(self) -> float | None:
        """Interquartile range of the samples (0 for fewer than two)."""
        if not self.times:
            return None
        if len(self.times) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times, n=4, method="inclusive")
        return q3 - q1


@attrs.frozen(kw_only=True)
class TuneResult(Generic[Cfg]):
    """Every trial and the fastest working config (``None`` if none worked).

    Attributes:
        best: The winner.
        trials: One per candidate, in the kernel's order.
        wall_seconds: Wall time of the whole tuning run.
        compile_wall_seconds: Wall time of the (parallel) compile phase.
        compile_workers: Threads that compiled.
    """

    best: Cfg | None = attrs.field(eq=False)
    trials: tuple[Trial[Cfg], ...] = ()
    wall_seconds: float | None = None
    compile_wall_seconds: float | None = None
    compile_workers: int = 1

    def count(self, status: str) -> int:
        """How many trials ended with ``status`` (one of :data:`STATUSES`)."""
        return sum(t.status == status for t in self.trials)

    @property
    def timed(self) -> int:
        return self.count("timed")

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def pruned(self) -> int:
        return self.count("pruned")

    @property
    def over_budget(self) -> int:
        return self.count("budget")

    def describe(self) -> str:
        """One line for an event, e.g. ``"12 candidates: 9 timed, 2 failed, 1 pruned, 0 over budget in 3.4s
        (compile 2.1s, 4 workers)"``."""
        text = (f"{len(self.trials)} candidates: {self.timed} timed, {self.failed} failed, {self.pruned} pruned, "
                f"{self.over_budget} over budget")
        if self.wall_seconds is not None:
            text += f" in {self.wall_seconds:.1f}s"
        if self.compile_wall_seconds is not None:
            workers = f"{self.compile_workers} worker{'s' if self.compile_workers != 1 else ''}"
            text += f" (compile {self.compile_wall_seconds:.1f}s, {workers})"
        return text

    def summary(self, describe: Callable[[Any], str] = repr) -> list[dict[str, Any]]:
        """JSON-able list of trials (kept as provenance in the persistent cache).

        Each entry has the candidate, its status, median / min / max / interquartile-range
        seconds per call, the calls per sample, its compile seconds and its error.
        """
        return [{"cfg": describe(t.cfg), "status": t.status, "median_s": t.seconds, "min_s": t.min_seconds,
                 "max_s": t.max_seconds, "iqr_s": t.iqr_seconds, "calls_per_sample": t.calls_per_sample,
                 "compile_s": t.compile_seconds, "error": t.error} for t in self.trials]


# -- errors and output checks ---------------------------------------------------------------------


def _error_text(stage: str, exc: BaseException) -> str:
    # The message itself, not the last line of format_exception_only: that is often a note
    # JAX appends ("JAX has removed its internal frames ..."), which hides the real reason.
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    message = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"  # XLA puts the cause last
    text = f"{type(exc).__name__}: {message}" if lines else type(exc).__name__
    return f"{stage} failed: {text}"[:500]


def _is_floating_dtype(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "fc" or bool(jax.numpy.issubdtype(dtype, jax.numpy.floating))


def _all_finite(out: Any) -> bool:
    """Whether every floating leaf of ``out`` is finite (computed on the device)."""
    for leaf in jax.tree.leaves(out):
        if _is_floating_dtype(np.dtype(leaf.dtype)) and not bool(_finite(leaf)):
            return False
    return True


@jax.jit
def _finite(x: jax.Array) -> jax.Array:
    return jax.numpy.isfinite(x).all()


def _describe_abstract(leaf: Any) -> str:
    return f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"


def _structure_error(out: Any, expected: Any) -> str | None:
    """Why ``out`` does not have ``expected``'s pytree structure, shapes and dtypes (``None``: it does)."""
    got_leaves, got_tree = jax.tree.flatten(out)
    want_leaves, want_tree = jax.tree.flatten(expected)
    if str(got_tree) != str(want_tree):
        return f"output structure differs from the baseline candidate: got {got_tree}, expected {want_tree}"
    for got, want in zip(got_leaves, want_leaves, strict=True):
        if tuple(got.shape) != tuple(want.shape) or np.dtype(got.dtype) != np.dtype(want.dtype):
            return (f"output shape or dtype differs from the baseline candidate: got {_describe_abstract(got)}, "
                    f"expected {_describe_abstract(want)}")
    return None


def tolerance(dtype: Any) -> tuple[float, float] | None:
    """``(atol, rtol)`` of the output check for ``dtype`` (``atol`` relative to the outputs' typical
    magnitude, see :func:`_compare`); ``None``: exact.

    The per-dtype table of :mod:`ejk.tolerances` (the conformance tolerances), no tighter than
    :data:`TOLERANCE_FLOOR`; other floating dtypes get four machine epsilons.
    """
    dt = np.dtype(dtype)
    if not _is_floating_dtype(dt):
        return None
    if dt.name in TOLERANCES:
        atol, rtol = TOLERANCES[dt.name]
    else:
        eps = float(jax.numpy.finfo(dt).eps)
        atol = rtol = 4 * eps
    return max(atol, TOLERANCE_FLOOR), max(rtol, TOLERANCE_FLOOR)


@jax.jit
def _compare(got: jax.Array, want: jax.Array, atol: jax.Array, rtol: jax.Array) -> tuple[jax.Array, ...]:
    """On the device: (all close, max abs err, scale). Elementwise, ``|got - want| <= atol * scale +
    rtol * |want|``, where ``scale`` is the median magnitude of ``want`` (at least 1): the outputs'
    typical size, so rounding noise on large outputs passes, while a candidate that zeroes (or
    otherwise breaks) the small outputs among large ones fails (the largest one would hide it)."""
    wide = jax.numpy.complex64 if jax.numpy.iscomplexobj(want) else jax.numpy.float32
    got, want = got.astype(wide), want.astype(wide)
    magnitude = jax.numpy.abs(want)
    typical = jax.numpy.nanmedian(jax.numpy.where(jax.numpy.isfinite(magnitude), magnitude, jax.numpy.nan))
    scale = jax.numpy.maximum(jax.numpy.nan_to_num(typical, nan=0.0), 1.0)  # none finite: 1
    close = jax.numpy.isclose(got, want, atol=atol * scale, rtol=rtol, equal_nan=True).all()
    return close, jax.numpy.nanmax(jax.numpy.abs(got - want), initial=0.0), scale


@jax.jit
def _equal(got: jax.Array, want: jax.Array) -> tuple[jax.Array, jax.Array]:
    diff = jax.numpy.abs(got.astype(jax.numpy.float32) - want.astype(jax.numpy.float32))
    return (got == want).all(), jax.numpy.max(diff, initial=0.0)


def _leaf_value_error(got: jax.Array, want: jax.Array) -> tuple[float, float] | None:
    """``(max abs err, tolerance)`` when ``got`` differs from ``want`` beyond the dtype's tolerance."""
    tol = tolerance(want.dtype)
    if tol is None:
        same, err = _equal(got, want)
        return None if bool(same) else (float(err), 0.0)
    atol, rtol = tol
    close, err, scale = _compare(got, want, np.float32(atol), np.float32(rtol))
    return None if bool(close) else (float(err), atol * float(scale))


def _value_error(out: Any, reference: Any) -> str | None:
    """Why ``out``'s values differ from the baseline ``reference`` (``None``: they agree)."""
    got_leaves = jax.tree.leaves(out)
    paths_and_refs = jax.tree_util.tree_flatten_with_path(reference)[0]
    for got, (path, want) in zip(got_leaves, paths_and_refs, strict=True):
        found = _leaf_value_error(got, want)
        if found is not None:
            where = f" at {jax.tree_util.keystr(path)}" if len(paths_and_refs) > 1 else ""
            err, tol = found
            return f"output differs from the baseline candidate{where}: max abs err {err:.3g} (tolerance {tol:.3g})"
    return None


class _OutputCheck:
    """Checks each candidate's first output against the baseline's; the first good output becomes the reference."""

    def __init__(self, policy: AutotunePolicy, expected: Any) -> None:
        self.policy = policy
        self.expected = expected  # abstract output of the baseline (None: take the reference's)
        self.reference: Any = None

    def __call__(self, out: Any) -> str | None:
        if self.policy.check_outputs:
            expected = self.expected if self.expected is not None else self.reference
            problem = _structure_error(out, expected) if expected is not None else None
            if problem is not None:
                return problem
        if self.policy.check_finite and not _all_finite(out):
            return "produced NaN or infinite values"
        if not self.policy.check_outputs:
            return None
        if self.reference is None:
            self.reference = out  # kept on the device; compared there
            return None
        return _value_error(out, self.reference)


# -- compiling ------------------------------------------------------------------------------------


def _is_float(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.floating)


def _with_backward(run: Callable[..., Any]) -> Callable[..., Any]:
    """``f(*args) -> (out, grads)``: the output and its VJP (cotangent ones) w.r.t. float inputs."""

    def forward_backward(*args: Any) -> Any:
        leaves, treedef = jax.tree.flatten(args)
        where = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]

        def of_floats(*floats: Any) -> Any:
            merged = list(leaves)
            for i, value in zip(where, floats, strict=True):
                merged[i] = value
            return run(*jax.tree.unflatten(treedef, merged))

        out, vjp = jax.vjp(of_floats, *(leaves[i] for i in where))
        return out, vjp(jax.tree.map(jax.numpy.ones_like, out))

    return forward_backward


@attrs.frozen(kw_only=True)
class _Built:
    """A candidate's compiled executable and abstract output, or why there is none."""

    compiled: Any = None
    out_info: Any = None
    seconds: float | None = None
    error: str | None = None
    over_budget: bool = False


def _objective_fn(kernel: Kernel[Cfg, Any], inv: Invocation[Cfg], cfg: Cfg,
                  policy: AutotunePolicy) -> Callable[..., Any]:
    run = bind_kernel(kernel, cfg, inv.kwargs)
    return _with_backward(run) if policy.objective == "forward_backward" else run


@attrs.frozen(kw_only=True)
class _Lowered:
    """A candidate lowered in the calling thread, ready to compile in any thread."""

    lowered: Any
    seconds: float


def _lower(fn: Callable[..., Any], args: tuple[Any, ...]) -> _Lowered | _Built:
    """Trace and lower ``fn`` (in the calling thread: its JAX config contexts and contextvars apply)."""
    start = _clock()
    try:
        lowered = jax.jit(fn).lower(*args)
    except Exception as exc:
        return _Built(error=_error_text("compile", exc))
    return _Lowered(lowered=lowered, seconds=_clock() - start)


def _compile(lowered: _Lowered) -> _Built:
    """Compile a lowered candidate (XLA releases the GIL while it compiles)."""
    start = _clock()
    out_info = getattr(lowered.lowered, "out_info", None)
    try:
        compiled = lowered.lowered.compile()
    except Exception as exc:
        return _Built(out_info=out_info, error=_error_text("compile", exc))
    return _Built(compiled=compiled, out_info=out_info, seconds=lowered.seconds + _clock() - start)


class _Budget:
    """The wall-clock deadline of one tuning run (none without ``max_seconds``)."""

    def __init__(self, max_seconds: float | None, start: float) -> None:
        self.max_seconds = max_seconds
        self.deadline = None if max_seconds is None else start + max_seconds

    def spent(self) -> bool:
        return self.deadline is not None and _clock() > self.deadline

    def note(self) -> str:
        return f"skipped: the tuning budget of {self.max_seconds:g}s was spent"


def _compile_all(fns: dict[int, Callable[..., Any]], order: list[int], args: tuple[Any, ...], workers: int,
                 budget: _Budget, advance: Callable[[], None]) -> dict[int, _Built]:
    """Build ``fns`` in ``order``; the first is the baseline, always built, the others while the budget lasts.

    Tracing and lowering happen here, one candidate after another (they hold the GIL anyway,
    and thread-local JAX settings and context variables must apply); compiling happens on
    ``workers`` threads while the next candidates are lowered.
    """
    baseline = order[0]

    def build(i: int, lowered: _Lowered | _Built) -> _Built:
        if isinstance(lowered, _Built):
            return lowered
        if i != baseline and budget.spent():
            return _Built(over_budget=True)
        return _compile(lowered)

    def lower(i: int) -> _Lowered | _Built:
        return _Built(over_budget=True) if i != baseline and budget.spent() else _lower(fns[i], args)

    results: dict[int, _Built] = {}
    if workers <= 1 or len(order) <= 1:
        for i in order:
            results[i] = build(i, lower(i))
            advance()
        return results
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(order)),
                                               thread_name_prefix="ejk-compile") as pool:
        futures = {pool.submit(build, i, lower(i)): i for i in order}  # started in this order
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
            advance()
    return results


# -- timing ---------------------------------------------------------------------------------------


class _L2Flusher:
    """Writes a buffer larger than the L2 cache with a tiny jitted op, evicting the kernel's data."""

    def __init__(self, nbytes: int, device: Any) -> None:
        self._fn = jax.jit(lambda buf: buf + 1)
        self._buf = jax.device_put(jax.numpy.zeros((max(nbytes // 4, 1),), jax.numpy.uint32), device)

    def __call__(self) -> None:
        self._buf = jax.block_until_ready(self._fn(self._buf))


def _device_of(args: tuple[Any, ...]) -> Any:
    for leaf in jax.tree.leaves(args):
        devices = getattr(leaf, "devices", None)
        if callable(devices):
            found = devices()
            if len(found) == 1:
                return next(iter(found))
    return jax.devices()[0]


def _make_flusher(policy: AutotunePolicy, args: tuple[Any, ...]) -> _L2Flusher | None:
    device = _device_of(args)
    flush = policy.flush_l2 if policy.flush_l2 is not None else device.platform in _GPU_PLATFORMS
    return _L2Flusher(policy.l2_flush_bytes, device) if flush and policy.l2_flush_bytes > 0 else None


def _sample(call: Callable[[], Any], calls: int, flush: Callable[[], None] | None = None,
            clock: str = "wall") -> float:
    """Seconds per call of ``calls`` back-to-back calls, blocking only after the last (``clock``:
    see :class:`AutotunePolicy`; the flush, which blocks, stays outside a device trace)."""
    if flush is not None:
        flush()
    if clock in ("device", "busy"):
        seconds = device_seconds_per_call(call, calls, busy=clock == "busy")
        if seconds is not None:
            return seconds
    out = None
    start = _clock()
    for _ in range(calls):
        out = call()
    jax.block_until_ready(out)
    return (_clock() - start) / calls


def _calls_per_sample(call: Callable[[], Any], policy: AutotunePolicy) -> int:
    """N such that a loop of N calls lasts about ``min_sample_seconds`` (at most ``max_calls_per_sample``).

    Doubles a trial loop until it lasts a quarter of the target, so the per-call estimate is
    not dominated by one call's dispatch and synchronisation latency.
    """
    if policy.calls_per_sample is not None:
        return policy.calls_per_sample
    target, cap = policy.min_sample_seconds, policy.max_calls_per_sample
    calls = 1
    per_call = _sample(call, calls)
    while calls * per_call < target / 4 and calls < cap:
        calls = min(2 * calls, cap)
        per_call = _sample(call, calls)
    return max(1, min(cap, math.ceil(target / max(per_call, 1e-9))))


def measure(call: Callable[[], Any], policy: AutotunePolicy,
            flush: Callable[[], None] | None = None) -> tuple[int, tuple[float, ...]]:
    """Time ``call`` (a compiled executable bound to its inputs) as the tuner times a candidate.

    ``policy.warmup`` untimed calls, then ``policy.repeats`` samples, each a loop of N
    back-to-back calls blocking only at its end (N chosen so that a sample lasts about
    ``policy.min_sample_seconds`` by the wall clock), ``flush`` (e.g. :func:`l2_flusher`) called
    before each, timed by ``policy.clock``.

    Returns:
        ``(N, seconds per call of each sample)``.
    """
    for _ in range(policy.warmup):
        jax.block_until_ready(call())
    calls = _calls_per_sample(call, policy)
    clock = _clock_kind(policy)
    return calls, tuple(_sample(call, calls, flush, clock) for _ in range(policy.repeats))


def _clock_kind(policy: AutotunePolicy) -> str:
    """``policy.clock``, except ``"wall"`` where JAX has no GPU (no device timeline to trace)."""
    return policy.clock if jax.default_backend() in _GPU_PLATFORMS else "wall"


def l2_flusher(policy: AutotunePolicy, args: tuple[Any, ...]) -> Callable[[], None] | None:
    """The L2 flush of ``policy`` for calls on ``args``' device (``None``: no flush there)."""
    return _make_flusher(policy, args)


def _time_built(cfg: Cfg, built: _Built, args: tuple[Any, ...], policy: AutotunePolicy, check: _OutputCheck,
                flush: Callable[[], None] | None) -> Trial[Cfg]:
    """Check a compiled candidate's first output, then time ``repeats`` loops of N calls."""
    compiled = built.compiled

    def call() -> Any:
        return compiled(*args)

    try:
        out = jax.block_until_ready(call())
        problem = check(out)
        if problem is not None:
            return Trial(cfg=cfg, compile_seconds=built.seconds, error=problem)
        calls, times = measure(call, policy, flush)
    except Exception as exc:
        return Trial(cfg=cfg, compile_seconds=built.seconds, error=_error_text("run", exc))
    return Trial(cfg=cfg, seconds=statistics.median(times), times=times, calls_per_sample=calls,
                 compile_seconds=built.seconds)


# -- the tuning run -------------------------------------------------------------------------------


def _baseline_index(kernel: Kernel[Cfg, Any], inv: Invocation[Cfg], candidates: list[Cfg],
                    usable: list[int]) -> int:
    """The kernel's heuristic config when it is a usable candidate, else the first usable one."""
    try:
        heuristic = kernel.heuristic_cfg(inv)
    except Exception:
        heuristic = None
    for i in usable:
        if heuristic is not None and candidates[i] == heuristic:
            return i
    return usable[0]


def _prune(kernel: Kernel[Cfg, Any], inv: Invocation[Cfg], candidates: list[Cfg]) -> dict[int, Trial[Cfg]]:
    """Trials of the candidates :meth:`Kernel.prune_reason` rules out."""
    pruned: dict[int, Trial[Cfg]] = {}
    for i, cfg in enumerate(candidates):
        try:
            reason = kernel.prune_reason(inv, cfg)
        except Exception as exc:
            pruned[i] = Trial(cfg=cfg, error=_error_text("prune check", exc))
            continue
        if reason is not None:
            pruned[i] = Trial(cfg=cfg, error=f"pruned: {reason}", status="pruned")
    return pruned


@contextmanager
def _progress(show: bool, title: str, total: int) -> Iterator[Callable[[], None]]:
    """An ``advance()`` callback driving a transient rich progress bar (a no-op when not shown)."""
    if not show:
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task(title, total=total)
        yield lambda: progress.advance(task)


def _expected_output(fn: Callable[..., Any], built: _Built, args: tuple[Any, ...]) -> Any:
    """The baseline's abstract output: from its lowering, else ``jax.eval_shape`` (``None`` if neither works)."""
    if built.out_info is not None:
        return built.out_info
    try:
        return jax.eval_shape(fn, *args)
    except Exception:
        return None


def autotune(kernel: Kernel[Cfg, Any], inv: Invocation[Cfg], candidates: Sequence[Cfg],
             policy: AutotunePolicy | None = None) -> TuneResult[Cfg]:
    """Time every candidate on ``kernel.tuning_args(inv)`` and return the fastest.

    Safe to call while an outer function is being traced by ``jax.jit``: inputs are made
    and executables run eagerly, outside the trace.
    """
    policy = policy or AutotunePolicy()
    start = _clock()
    budget = _Budget(policy.max_seconds, start)
    todo = list(candidates)[: policy.max_candidates] if policy.max_candidates else list(candidates)
    trials: dict[int, Trial[Cfg]] = _prune(kernel, inv, todo)
    usable = [i for i in range(len(todo)) if i not in trials]
    compile_wall = None
    workers = policy.compile_workers
    if usable:
        baseline = _baseline_index(kernel, inv, todo, usable)
        order = [baseline, *(i for i in usable if i != baseline)]
        show = policy.progress if policy.progress is not None else (sys.stderr.isatty() and len(todo) >= 4)
        with jax.ensure_compile_time_eval():
            args = kernel.tuning_args(inv)
            fns = {i: _objective_fn(kernel, inv, todo[i], policy) for i in order}
            with _progress(show, f"compiling {inv.op_id_v}", len(order)) as advance:
                compile_start = _clock()
                built = _compile_all(fns, order, args, workers, budget, advance)
                compile_wall = _clock() - compile_start
            check = _OutputCheck(policy, _expected_output(fns[baseline], built[baseline], args))
            flush = _make_flusher(policy, args)
            with _progress(show, f"timing {inv.op_id_v}", len(order)) as advance:
                for i in order:
                    trials[i] = _trial(todo[i], built.pop(i), args, policy, check, flush,
                                       budget if i != baseline else None)
                    advance()
    ordered = tuple(trials[i] for i in range(len(todo)))
    timed = [t for t in ordered if t.seconds is not None]
    best = min(timed, key=lambda t: t.seconds or 0.0).cfg if timed else None
    return TuneResult(best=best, trials=ordered, wall_seconds=_clock() - start,
                      compile_wall_seconds=compile_wall, compile_workers=workers)


def _trial(cfg: Cfg, built: _Built, args: tuple[Any, ...], policy: AutotunePolicy, check: _OutputCheck,
           flush: Callable[[], None] | None, budget: _Budget | None) -> Trial[Cfg]:
    """One candidate's trial from its build: skipped by the budget, failed to compile, or timed."""
    if built.over_budget or (budget is not None and budget.spent()):
        note = budget.note() if budget is not None else "skipped: the tuning budget was spent"
        return Trial(cfg=cfg, compile_seconds=built.seconds, error=note, status="budget")
    if built.error is not None:
        return Trial(cfg=cfg, error=built.error)
    return _time_built(cfg, built, args, policy, check, flush)
