"""``ejk.explain``: which implementation and config a call would use, and why not the others."""

from __future__ import annotations

from typing import Any

import attrs

from ejk.execution.executor import Executor
from ejk.execution.kernel import Invocation
from ejk.ops._base import ImplChoice, OpKernel, get_default_executor, resolve_platform
from ejk.registry import KernelSpec

__all__ = ["Explanation", "ImplementationReport", "explain"]


@attrs.frozen(kw_only=True)
class ImplementationReport:
    """One implementation's part in a decision.

    Attributes:
        label: ``platform/backend:name``.
        plugin: The plugin that registered it.
        status: ``chosen``, ``usable`` (could run, not chosen), ``refused`` (its gate or backend
            says no), ``unavailable`` (its platform cannot run here) or ``not requested`` (a
            forced ``platform=`` excludes it).
        reason: Why it is not chosen (a gate's reason, the platform's problem and fix).
        slowdown: Its best tuned time over the chosen one's, when tuning data exists.
        backward: For a forward-only implementation (``ejk.VJP`` without ``bwd``): ``paired by
            residuals '<tag>'``, and for a usable one whose backward would run on this call,
            e.g. ``paired by residuals 'flash_attention:inputs+out+lse2': triton/gpu:flash``;
            ``None`` for the others.
    """

    label: str
    plugin: str | None
    status: str
    reason: str | None = None
    slowdown: float | None = None
    backward: str | None = None


@attrs.frozen(kw_only=True)
class Explanation:
    """What :func:`explain` found.

    Attributes:
        call: The call, e.g. ``flash_attention@1(4x4096x16x128:bfloat16, ...)``.
        tier: The tier that decides: ``override``, ``plugin``, ``overlay``, ``memory``,
            ``persistent``, ``autotune`` (a miss that would be tuned), ``heuristic`` or
            ``frozen`` (a miss that would raise).
        chosen: The choice that would run (for ``autotune``: the heuristic fallback).
        detail: The tier's own detail (cache path, skipped entries, candidates to time).
        implementations: Every registered implementation, the chosen one first.
        ranking: When the heuristics tier picks the implementation (tiers ``heuristic`` and
            ``autotune``): why it ranks first, e.g. ``ranked by pack <file> for device gpu|NVIDIA_H100*``
            or ``tier fast, priority 5``; ``None`` otherwise.
    """

    call: str
    tier: str
    chosen: ImplChoice | None
    detail: str
    implementations: tuple[ImplementationReport, ...]
    ranking: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "call": self.call, "tier": self.tier, "chosen": None if self.chosen is None else str(self.chosen),
            "detail": self.detail, "implementations": [attrs.asdict(r) for r in self.implementations],
            "ranking": self.ranking,
        }


def _status(usable: bool, requested: bool, reason: str | None) -> str:
    if not requested:
        return "not requested"
    if usable:
        return "usable"
    return "unavailable" if reason is not None and reason.startswith("platform ") else "refused"


def _backward(kernel: OpKernel, spec: KernelSpec, inv: Invocation[ImplChoice], status: str,
              chosen: ImplChoice | None) -> str | None:
    """Whose backward a forward-only implementation's gradients would run (``None``: it has its own)."""
    if spec.vjp is None or not spec.vjp.paired:
        return None
    text = spec.vjp.describe_backward()
    if status == "chosen" and chosen is not None and chosen.backward is not None:
        return f"{text}; this choice names {kernel.cfg_label(chosen.backward)}"
    if status not in ("chosen", "usable"):
        return text
    try:
        return f"{text}: {kernel.paired_backward(spec, kernel.call_view(inv)).label}"
    except NotImplementedError:  # its gate refuses such calls; a forced choice says why when run
        return text


def _kernel_named(name: str, arity: int) -> OpKernel:
    """The op named ``name``, else the kernel of a registered algorithm without an op (``ejk.run``)."""
    from ejk.ops._definition import OPS, get_op
    from ejk.ops._generic import algorithm_kernel
    from ejk.registry import kernel_registry

    if name in OPS:
        return OPS[name].kernel
    if name.strip().lower() in kernel_registry.list_algorithms():  # loads the plugins, which may define ops
        return OPS[name].kernel if name in OPS else algorithm_kernel(name, arity)
    return get_op(name).kernel  # raises: unknown operation, naming the known ones


def explain(op: str | OpKernel, *args: Any, platform: str = "auto", cfg: Any = None,
            executor: Executor[Any, Any] | None = None, **kwargs: Any) -> Explanation:
    """Explain the choice for a call of a public operation, without running or tuning anything.

    Takes the operation (its name, e.g. ``"flash_attention"``, or the name of a registered
    algorithm without an op, called as :func:`ejk.run` calls it) and the same arguments as the
    operation; arrays may be ``jax.ShapeDtypeStruct`` (only shapes and dtypes matter).

    Returns:
        An :class:`Explanation`: the tier and choice, and for every other implementation why it
        was not chosen — its capability gate's reason, its platform's problem and fix, or how
        much slower it measured when tuning data exists.
    """
    kernel = _kernel_named(op, len(args)) if isinstance(op, str) else op
    executor = executor or get_default_executor()
    plat = resolve_platform(platform)
    arrays, static = kernel.normalize(*args, **kwargs)
    choice = None if cfg is None else kernel.choice_for(cfg, plat)
    inv = executor.invocation(kernel, arrays, {**static, "platform": plat}, choice)
    peek = getattr(executor.chooser, "peek", None)
    if peek is None:
        raise TypeError(f"explain needs a chooser with peek() (a ConfigSelectorChain), not "
                        f"{type(executor.chooser).__name__}")
    event = peek(inv, kernel)
    chosen: ImplChoice | None = event.cfg
    chosen_label = None if chosen is None else kernel.cfg_label(chosen)
    details_of = getattr(executor.chooser, "tuning_details", None)
    details = details_of(inv, kernel) if details_of is not None else None
    timings: dict[str, float] = dict((details or {}).get("by_implementation") or {})
    chosen_time = timings.get(chosen_label or "")
    order = _heuristic_order(kernel, inv) if event.tier in ("heuristic", "autotune") else {}
    reports = []
    for candidate in kernel.candidates(inv):
        spec = candidate.spec
        slowdown = None
        if chosen_time and spec.label in timings:
            slowdown = timings[spec.label] / chosen_time
        if spec.label == chosen_label:
            status, reason = "chosen", None
        else:
            status = _status(candidate.usable, candidate.requested, candidate.reason)
            reason = candidate.reason
            if status == "not requested":
                reason = f"platform={plat} was requested"
            elif status == "usable":
                reason = (f"{slowdown:.2f}x the chosen one's time" if slowdown is not None
                          else f"not chosen by the {event.tier} tier" + (f" ({order[spec.label]})"
                                                                         if spec.label in order else ""))
        reports.append(ImplementationReport(label=spec.label, plugin=str(spec.plugin) if spec.plugin else None,
                                            status=status, reason=reason, slowdown=slowdown,
                                            backward=_backward(kernel, spec, inv, status, chosen)))
    reports.sort(key=lambda r: r.status != "chosen")
    return Explanation(call=inv.describe(), tier=event.tier, chosen=chosen, detail=event.detail,
                       implementations=tuple(reports), ranking=order.get(chosen_label or ""))


def _heuristic_order(kernel: OpKernel, inv: Invocation[ImplChoice]) -> dict[str, str]:
    """Why each usable implementation stands where it does in the heuristics tier, by label
    (``#2, ranked by pack ...``; the first without its place)."""
    ranked = kernel.ranking(kernel.usable_specs(inv), inv)
    return {spec.label: why if place == 1 else f"#{place}, {why}" for place, (spec, why) in enumerate(ranked, 1)}
