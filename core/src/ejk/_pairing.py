"""Forward-only implementations: another implementation's backward, paired by the residual tag.

An implementation registered with ``ejk.VJP(fwd=..., residuals=TAG)`` and no ``bwd`` saves its
residuals in a format other implementations share and has no backward of its own. Per call, the
core pairs it with the best other implementation of the same algorithm whose own backward consumes
``TAG`` and accepts the call (:func:`paired_backward`): the op layer runs that backward on these
residuals, and the registration's capability gate refuses calls for which none pairs
(:func:`paired_capability`), so ``platform="auto"`` never picks a forward whose gradients fail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ejk._contract import fit_call, gate_reason
from ejk._kernel_spec import Backend, KernelSpec, default_backend

if TYPE_CHECKING:
    from ejk.registry import KernelRegistry

__all__ = ["paired_backward", "paired_capability", "pairing_candidates", "pairing_reason"]


def _default_fix(algorithm: str, tag: str) -> str:
    return (f"Install a plugin whose implementation of {algorithm!r} has a backward of residuals {tag!r}, "
            "or differentiate through another platform (platform=...).")


def pairing_candidates(registry: KernelRegistry, spec: KernelSpec,
                       among: Sequence[KernelSpec] | None = None) -> list[KernelSpec]:
    """The implementations whose backward may run on forward-only ``spec``'s residuals, in the
    registry's order (or ``among``'s, e.g. an op variant's derived implementations): those of
    ``spec.algorithm`` with a backward of their own declaring ``spec.vjp.residuals`` (which one
    does is decided per call, by :func:`paired_backward`)."""
    tag = spec.vjp.residuals if spec.vjp is not None else None
    found = registry.list_implementations(spec.algorithm) if among is None else among
    return [other for other in found if other.vjp is not None and not other.vjp.paired and other.vjp.residuals == tag]


def paired_backward(registry: KernelRegistry, spec: KernelSpec, call: Mapping[str, Any],
                    candidates: Sequence[KernelSpec] | None = None) -> KernelSpec:
    """The implementation whose backward runs on forward-only ``spec``'s residuals for ``call``.

    Candidates are the other implementations of ``spec.algorithm`` with a backward of their own that
    declare ``spec.vjp.residuals``, target JAX's default backend (or any) and whose capability gate
    accepts ``call``. The first in the registry's order (tier, then priority) whose platform is
    available wins; else (an interpreter mode on a CPU, where a platform reports itself unavailable
    but its gate accepts the call) the first whose gate accepts it.

    Args:
        registry: Where to look.
        spec: The forward-only implementation (``spec.vjp.bwd`` is ``None``).
        call: The keyword view of the call (abstract arrays by name, then the static arguments).
        candidates: The implementations of ``spec.algorithm`` to look among, highest priority first
            (default: the registry's; an op variant passes its derived ones too).

    Raises:
        NotImplementedError: naming every candidate's reason (or that none is installed) and the fix.
    """
    assert spec.vjp is not None and spec.vjp.paired, f"{spec.label} has a backward of its own"
    tag = spec.vjp.residuals
    backend = default_backend()
    reasons: list[str] = []
    fallback: KernelSpec | None = None
    for other in pairing_candidates(registry, spec, candidates):
        if other.backend not in (Backend.ANY, backend):
            reasons.append(f"{other.label}: targets {other.backend}, not JAX's default backend {backend}")
            continue
        gate = gate_reason(other, call)  # extension arguments it does not take refuse too
        if gate is not None:
            reasons.append(f"{other.label}: {gate}")
            continue
        available, why = registry.spec_available(other)
        if available:
            return other
        reasons.append(f"{other.label}: platform {other.platform} is unavailable: {why}")
        fallback = fallback or other
    if fallback is not None:
        return fallback
    found = "; ".join(reasons) if reasons else "none is installed"
    raise NotImplementedError(
        f"{spec.algorithm}: {spec.label} has no backward of its own; it pairs with another implementation whose "
        f"backward consumes residuals {tag!r}, and none can run this call ({found}). "
        f"{spec.vjp.fix or _default_fix(spec.algorithm, tag)}"
    )


def pairing_reason(registry: KernelRegistry, spec: KernelSpec, call: Mapping[str, Any],
                   candidates: Sequence[KernelSpec] | None = None) -> str | None:
    """Why gradients of ``call`` through forward-only ``spec`` could not be taken, else ``None``."""
    try:
        paired_backward(registry, spec, call, candidates)
    except NotImplementedError as exc:
        return f"no installed backward pairs with it for gradients ({exc})"
    return None


def paired_capability(registry: KernelRegistry, spec: KernelSpec) -> Callable[..., str | None]:
    """``spec``'s capability gate (``None``: accepts all) that also refuses calls no backward pairs with.

    The gate cannot know whether a call will be differentiated, so it refuses forward-only
    (inference) calls too: ``platform="auto"`` then takes an implementation whose gradients work.
    """
    own = spec.capability

    def capability(**call: Any) -> str | None:
        reason = None if own is None else own(**fit_call(own, call, spec.algorithm))
        return reason if reason is not None else pairing_reason(registry, spec, call)

    capability.__doc__ = (f"{spec.label}'s capability gate, refusing too where no backward of residuals "
                          f"{spec.vjp.residuals if spec.vjp else ''!r} pairs with the call.")
    if own is not None:
        capability.__wrapped__ = own  # type: ignore[attr-defined]
    return capability
