"""Autotuning: time each candidate config's *compiled executable* on representative inputs.

Never times tracing or compilation: each candidate is lowered and compiled first, run for
warm-up, then timed over several repetitions; the median wins. A candidate that fails to
compile or run, or produces non-finite values, is skipped and the reason kept.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import jax
import numpy as np

from ejk import environment
from ejk.execution.kernel import bind_kernel

if TYPE_CHECKING:
    from ejk.execution.kernel import Invocation, Kernel

__all__ = ["AutotunePolicy", "Trial", "TuneResult", "autotune"]

Cfg = TypeVar("Cfg")
OBJECTIVES = ("forward", "forward_backward")


@attrs.frozen(kw_only=True)
class AutotunePolicy:
    """When and how to autotune.

    Attributes:
        autotune: ``True``/``False``; ``None`` follows ``EJK_AUTOTUNE`` (default off).
        warmup: Untimed runs of each compiled candidate.
        repeats: Timed runs; the median counts.
        max_candidates: Try at most this many candidates (in the kernel's order).
        persist: Write the winner to the persistent cache.
        progress: Show a progress bar; ``None`` shows one on a terminal for 4+ candidates.
        check_finite: Reject candidates whose output has NaN or infinity.
        objective: ``"forward"`` times the output alone; ``"forward_backward"`` times the output
            plus its VJP with respect to every floating-point input (for training, where the
            backward pass dominates). The objective is recorded with each persisted config.
    """

    autotune: bool | None = None
    warmup: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    repeats: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    max_candidates: int | None = None
    persist: bool = True
    progress: bool | None = None
    check_finite: bool = True
    objective: str = attrs.field(default="forward", validator=attrs.validators.in_(OBJECTIVES))

    mode: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.in_(("autotune", "heuristics", "frozen"))))

    def effective_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        if self.autotune is not None:
            return "autotune" if self.autotune else "heuristics"
        return "autotune" if environment.autotune_enabled() else "heuristics"

    def enabled(self) -> bool:
        return self.effective_mode() == "autotune"


@attrs.frozen(kw_only=True)
class Trial(Generic[Cfg]):
    """One candidate's outcome: median seconds, or the error that disqualified it."""

    cfg: Cfg = attrs.field(eq=False)
    seconds: float | None = None
    times: tuple[float, ...] = ()
    compile_seconds: float | None = None
    error: str | None = None


@attrs.frozen(kw_only=True)
class TuneResult(Generic[Cfg]):
    """Every trial and the fastest working config (``None`` if none worked)."""

    best: Cfg | None = attrs.field(eq=False)
    trials: tuple[Trial[Cfg], ...] = ()

    def summary(self, describe: Callable[[Any], str] = repr) -> list[dict[str, Any]]:
        """JSON-able list of trials (kept as provenance in the persistent cache)."""
        return [{"cfg": describe(t.cfg), "median_s": t.seconds, "error": t.error} for t in self.trials]


def _error_text(stage: str, exc: BaseException) -> str:
    # The message itself, not the last line of format_exception_only: that is often a note
    # JAX appends ("JAX has removed its internal frames ..."), which hides the real reason.
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    message = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"  # XLA puts the cause last
    text = f"{type(exc).__name__}: {message}" if lines else type(exc).__name__
    return f"{stage} failed: {text}"[:500]


def _all_finite(out: Any) -> bool:
    for leaf in jax.tree.leaves(out):
        arr = np.asarray(leaf)
        floating = arr.dtype.kind in "fc" or arr.dtype.name == "bfloat16"
        if floating and not np.isfinite(arr.astype(np.complex64 if arr.dtype.kind == "c" else np.float32)).all():
            return False
    return True


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


def _time_candidate(kernel: Kernel[Cfg, Any], inv: Invocation[Cfg], cfg: Cfg, args: tuple[Any, ...],
                    policy: AutotunePolicy) -> Trial[Cfg]:
    run = bind_kernel(kernel, cfg, inv.kwargs)
    if policy.objective == "forward_backward":
        run = _with_backward(run)
    start = time.perf_counter()
    try:
        compiled = jax.jit(run).lower(*args).compile()
    except Exception as exc:
        return Trial(cfg=cfg, error=_error_text("compile", exc))
    compile_s = time.perf_counter() - start
    try:
        out = None
        for _ in range(policy.warmup):
            out = jax.block_until_ready(compiled(*args))
        times = []
        for _ in range(policy.repeats):
            t0 = time.perf_counter()
            out = jax.block_until_ready(compiled(*args))
            times.append(time.perf_counter() - t0)
    except Exception as exc:
        return Trial(cfg=cfg, compile_seconds=compile_s, error=_error_text("run", exc))
    if policy.check_finite and not _all_finite(out):
        return Trial(cfg=cfg, compile_seconds=compile_s, error="produced NaN or infinite values")
    return Trial(cfg=cfg, seconds=statistics.median(times), times=tuple(times), compile_seconds=compile_s)


def autotune(kernel: Kernel[Cfg, Any], inv: Invocation[Cfg], candidates: Sequence[Cfg],
             policy: AutotunePolicy | None = None) -> TuneResult[Cfg]:
    """Time every candidate on ``kernel.tuning_args(inv)`` and return the fastest.

    Safe to call while an outer function is being traced by ``jax.jit``: inputs are made
    and executables run eagerly, outside the trace.
    """
    policy = policy or AutotunePolicy()
    todo = list(candidates)[: policy.max_candidates] if policy.max_candidates else list(candidates)
    show = policy.progress if policy.progress is not None else (sys.stderr.isatty() and len(todo) >= 4)
    trials: list[Trial[Cfg]] = []
    with jax.ensure_compile_time_eval():
        args = kernel.tuning_args(inv)
        if show:
            from rich.progress import Progress

            with Progress(transient=True) as progress:
                task = progress.add_task(f"autotuning {inv.op_id_v}", total=len(todo))
                for cfg in todo:
                    trials.append(_time_candidate(kernel, inv, cfg, args, policy))
                    progress.advance(task)
        else:
            trials = [_time_candidate(kernel, inv, cfg, args, policy) for cfg in todo]
    working = [t for t in trials if t.seconds is not None]
    best = min(working, key=lambda t: t.seconds or 0.0).cfg if working else None
    return TuneResult(best=best, trials=tuple(trials))
