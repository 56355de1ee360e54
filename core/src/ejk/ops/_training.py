"""What a differentiated call runs: the ``"fwd+bwd"`` rankings of config packs.

A pack may rank implementations twice for one device and shape class: by their forward
(``"mode": "fwd"``) and by their forward plus backward (``"mode": "fwd+bwd"``), the latter naming
pairings too (``"<forward>+<backward>"``: one implementation's forward with another's backward of
the same residuals). The heuristics tier picks the forward by the first; where the second prefers
another implementation or pairing, the choice carries it as :attr:`ImplChoice.training`, which runs
whenever the call is differentiated (the op's custom VJP takes that forward and its backward), while
calls that are not differentiated run the forward's winner. A forward-only implementation pairs
with the backward its pair labels rank first (else the registry's order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ejk.config.packs import pack_rankings
from ejk.config.rankings import Ranking
from ejk.registry import KernelSpec

if TYPE_CHECKING:
    from ejk.execution.kernel import Invocation
    from ejk.ops._base import ImplChoice, OpKernel

__all__ = ["pair_label", "pairing_order", "training_choice", "training_rankings"]

_TRAINING = "fwd+bwd"


def pair_label(forward: KernelSpec, backward: KernelSpec) -> str:
    """The label a ``"fwd+bwd"`` ranking gives ``forward``'s forward run with ``backward``'s backward."""
    return f"{forward.label}+{backward.label}"


def training_rankings(kernel: OpKernel, device: str, call: Mapping[str, Any]) -> list[Ranking]:
    """The rankings of differentiated calls (``"mode": "fwd+bwd"``) that apply to ``call`` on ``device``;
    rankings without a mode order forward calls and leave the training choice to them."""
    return [r for r in pack_rankings(kernel._host(), kernel.op_id, device, kernel.ranking_view(call), mode=_TRAINING)
            if r.mode == _TRAINING]


def pairing_order(rankings: Sequence[Ranking], spec: KernelSpec,
                  candidates: Sequence[KernelSpec]) -> list[KernelSpec]:
    """``candidates`` (backwards for forward-only ``spec``) ordered by where ``rankings`` put each pairing;
    those no ranking names keep their order, after the named ones."""
    return sorted(candidates, key=lambda other: tuple(r.position(pair_label(spec, other)) for r in rankings))


def training_choice(kernel: OpKernel, inv: Invocation[ImplChoice], ranked: Sequence[KernelSpec]) -> ImplChoice | None:
    """The choice a differentiated call runs when the ``"fwd+bwd"`` rankings prefer another one than the
    forward's winner ``ranked[0]`` (``ranked``: the usable implementations in the forward's order), with
    heuristic configs; ``None`` when no such ranking applies or it agrees."""
    call = kernel.call_view(inv)
    rankings = training_rankings(kernel, inv.device, call)
    if not rankings or not ranked:
        return None
    usable = {spec.label: spec for spec in ranked}
    known = {spec.label: spec for spec in kernel.implementations()}
    options: list[tuple[KernelSpec, KernelSpec | None, str]] = [(spec, None, spec.label) for spec in ranked]
    for label in dict.fromkeys(label for r in rankings for label in r.order if "+" in label):
        forward, _, backward = label.partition("+")
        if forward in usable and backward in known and _pairs(kernel, inv, usable[forward], known[backward]):
            options.append((usable[forward], known[backward], label))
    place = {spec.label: i for i, spec in enumerate(ranked)}
    best = min(options, key=lambda o: (*(r.position(o[2]) for r in rankings), place[o[0].label], o[1] is not None))
    forward_spec, backward_spec, _ = best
    if forward_spec is ranked[0] and backward_spec is None:
        return None
    choice = kernel._choice(forward_spec, kernel.heuristic_of(forward_spec, inv))
    if backward_spec is None:
        return choice
    return attrs.evolve(choice, backward=kernel._choice(backward_spec, kernel.heuristic_of(backward_spec, inv)))


def _pairs(kernel: OpKernel, inv: Invocation[ImplChoice], forward: KernelSpec, backward: KernelSpec) -> bool:
    """Whether ``backward``'s backward can run on ``forward``'s residuals for this call."""
    choice = attrs.evolve(kernel._choice(forward, None), backward=kernel._choice(backward, None))
    return kernel.unusable_reason(inv, choice) is None
