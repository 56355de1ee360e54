"""The call contract of an op: how the core calls every implementation of it.

An op declared with :func:`ejk.ops.define_op` calls each implementation as
``impl(*positional, **keyword_arrays, **static, cfg=cfg)``, its VJP's forward the same way and its
backward as ``bwd(residuals, cotangent, cfg=cfg, **static)``. The op layer declares the contract
(:func:`declare`); the registry checks each registration against it (:func:`contract_of`) and refuses
one that cannot take the call, so a wrong signature fails at registration, against its plugin, and
never in a user's call.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

import attrs

from ejk._kernel_spec import VJP, KernelSpec, capability_reason

__all__ = ["CallContract", "Extension", "accepts", "contract_of", "declare", "extension_refusal", "fit_call",
           "gate_reason", "generation", "takes"]


@attrs.frozen
class Extension:
    """An argument added to an op after implementations were written against it.

    An implementation whose signature names it receives it on every call; one that does not is
    called without it, and refuses (through the core, after its own gate) every call whose value
    differs from :attr:`legacy`, the value under which the op behaves as it did before. An
    :attr:`advisory` one never refuses: it tells an implementation about the call without changing
    what the implementation must return.

    Attributes:
        name: The argument's name (an array of ``array_names`` or a static argument).
        legacy: Its value in calls an implementation unaware of it runs correctly (``None`` for an
            optional array; e.g. ``"default"`` for a static ``precision``).
        since: The ejk-core version that added it (named in the refusal).
        advisory: Every value is one an implementation unaware of it runs correctly (e.g. how the
            op layer will use the output, which an implementation may exploit): it is left out for
            an implementation that does not name it, and refuses nothing.
    """

    name: str
    legacy: Any = None
    since: str = ""
    advisory: bool = False

    def is_legacy(self, value: Any) -> bool:
        """Whether ``value`` is the legacy value (an absent argument always is; so is every value of
        an advisory extension)."""
        if self.advisory or value is None or value is self.legacy:
            return True
        if self.legacy is None or hasattr(value, "shape"):
            return False
        try:
            return bool(value == self.legacy)
        except Exception:  # an odd value that does not compare: not the legacy one
            return False

    def refusal(self, algorithm: str) -> str:
        since = f" in ejk-core {self.since}" if self.since else ""
        return (f"does not take {self.name}= (added to {algorithm}{since}); it runs only calls with "
                f"{self.name}={self.legacy!r}")


@attrs.frozen(kw_only=True)
class CallContract:
    """The arguments every implementation of one op receives.

    Attributes:
        algorithm: The op's name.
        positional: The array arguments passed positionally, in order.
        keyword_arrays: The array arguments passed by keyword (``None`` when absent).
        static: The static keyword arguments.
    """

    algorithm: str
    positional: tuple[str, ...]
    keyword_arrays: tuple[str, ...] = ()
    static: tuple[str, ...] = ()
    extensions: tuple[Extension, ...] = ()

    @property
    def extension_names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.extensions)

    def _required(self, names: tuple[str, ...]) -> tuple[str, ...]:
        optional = set(self.extension_names)
        return tuple(n for n in names if n not in optional)

    def describe(self) -> str:
        """The call as the core makes it, e.g. ``impl(a, b, *, precision, preferred_element_type, cfg)``;
        extension arguments (passed only to implementations that name them) in brackets."""
        required = (*self._required(self.keyword_arrays), *self._required(self.static), "cfg")
        optional = tuple(f"[{name}]" for name in self.extension_names)
        return f"impl({', '.join((*self.positional, '*', *required, *optional))})"

    def _bind_problem(self, fn: Callable[..., Any], positional: int, keywords: tuple[str, ...]) -> str | None:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature to read (a builtin): nothing to check
            return None
        try:
            signature.bind(*range(positional), **dict.fromkeys(keywords))
        except TypeError as exc:
            return str(exc)
        return None

    def problems(self, implementation: Callable[..., Any], vjp: VJP | None = None) -> list[str]:
        """Why an implementation (and its VJP) cannot take this op's calls; empty when it can.
        Only whether the call binds counts: names of positional parameters, defaults and
        annotations are the implementation's own business. Extension arguments are not required."""
        keywords = (*self._required(self.keyword_arrays), *self._required(self.static), "cfg")
        found = []
        parts: list[tuple[str, Callable[..., Any], int, tuple[str, ...]]] = [
            ("forward", implementation, len(self.positional), keywords)]
        if vjp is not None:
            parts.append(("VJP fwd", vjp.fwd, len(self.positional), keywords))
            if vjp.bwd is not None:
                parts.append(("VJP bwd", vjp.bwd, 2, ("cfg", *self._required(self.static))))
        for what, fn, positional, names in parts:
            problem = self._bind_problem(fn, positional, names)
            if problem is not None:
                found.append(f"its {what} {_describe(fn)} cannot be called as "
                             f"{self.describe() if what != 'VJP bwd' else self._describe_bwd()}: {problem}")
        return found

    def _describe_bwd(self) -> str:
        return f"bwd(residuals, cotangent, *, {', '.join(('cfg', *self._required(self.static)))})"


def _describe(fn: Callable[..., Any]) -> str:
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return name


_contracts: dict[str, Callable[[], CallContract | None]] = {}
_resolved: dict[str, CallContract | None] = {}
_lock = threading.Lock()
_generation = 0


def generation() -> int:
    """A counter that changes whenever an op declares its contract (registries then check what
    they registered before the op was defined)."""
    return _generation


def declare(algorithm: str, contract: Callable[[], CallContract | None]) -> None:
    """Declare how ``algorithm``'s implementations are called; ``contract`` is computed on first need
    (``None``: the op cannot say, nothing is checked)."""
    global _generation
    with _lock:
        _contracts[algorithm] = contract
        _resolved.pop(algorithm, None)
        _generation += 1


def contract_of(algorithm: str) -> CallContract | None:
    """The declared contract of ``algorithm`` (``None`` while no op declares it)."""
    if algorithm in _resolved:
        return _resolved[algorithm]
    with _lock:
        provider = _contracts.get(algorithm)
    if provider is None:
        return None
    try:
        contract = provider()
    except Exception as exc:  # an op's broken sample call must not take every query down
        warnings.warn(f"op {algorithm}: its call contract could not be computed ({type(exc).__name__}: {exc}); "
                      "its implementations' signatures are not checked", RuntimeWarning, stacklevel=2)
        contract = None
    with _lock:
        _resolved[algorithm] = contract
    return contract


# -- extension arguments: who takes them ------------------------------------------------------------


def _read_parameters(fn: Callable[..., Any], follow_wrapped: bool) -> tuple[frozenset[str], bool] | None:
    try:
        signature = inspect.signature(fn, follow_wrapped=follow_wrapped)
    except (TypeError, ValueError):
        return None
    named = frozenset(p.name for p in signature.parameters.values()
                      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return named, any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())


@functools.lru_cache(maxsize=4096)
def _cached_parameters(fn: Callable[..., Any], follow_wrapped: bool) -> tuple[frozenset[str], bool] | None:
    return _read_parameters(fn, follow_wrapped)


def _parameters(fn: Callable[..., Any], follow_wrapped: bool = True) -> tuple[frozenset[str], bool] | None:
    try:
        return _cached_parameters(fn, follow_wrapped)
    except TypeError:  # unhashable callable: read it each time
        return _read_parameters(fn, follow_wrapped)


def takes(fn: Callable[..., Any] | None, name: str) -> bool:
    """Whether ``fn``'s signature names parameter ``name`` (read through ``functools.wraps``'
    ``__wrapped__`` and a ``__signature__``). ``**kwargs`` alone does not count: an implementation
    receives an extension argument only when it says it handles it."""
    if fn is None:
        return False
    found = _parameters(fn)
    return found is not None and name in found[0]


def accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` can be passed keyword ``name``: it names it, or its own signature (not the
    one it wraps) has ``**kwargs``."""
    outer = _parameters(fn, follow_wrapped=False)
    return takes(fn, name) or (outer is not None and outer[1])


def _extensions(algorithm: str, extensions: tuple[Extension, ...] | None) -> tuple[Extension, ...]:
    if extensions is not None:
        return extensions
    contract = contract_of(algorithm)
    return () if contract is None else contract.extensions


def fit_call(fn: Callable[..., Any], call: Mapping[str, Any], algorithm: str,
             extensions: tuple[Extension, ...] | None = None) -> dict[str, Any]:
    """``call`` (the keyword view a callback receives) without the extension arguments ``fn`` cannot
    be passed: a gate, heuristic or config space written before an extension existed keeps working."""
    dropped = [e.name for e in _extensions(algorithm, extensions) if e.name in call and not accepts(fn, e.name)]
    if not dropped:
        return dict(call)
    return {k: v for k, v in call.items() if k not in dropped}


def spec_takes(spec: KernelSpec, extension: Extension, *, static: bool) -> bool:
    """Whether ``spec`` handles ``extension``: its forward (and VJP forward) name it, and for a static
    one its own backward too."""
    forwards = [spec.implementation] + ([spec.vjp.fwd] if spec.vjp is not None else [])
    if not all(takes(fn, extension.name) for fn in forwards):
        return False
    if static and spec.vjp is not None and spec.vjp.bwd is not None:
        return takes(spec.vjp.bwd, extension.name)
    return True


def extension_refusal(spec: KernelSpec, call: Mapping[str, Any], static_names: Collection[str] = (),
                      extensions: tuple[Extension, ...] | None = None) -> str | None:
    """Why ``spec`` cannot run ``call`` because it does not take one of its op's extension arguments
    whose value in ``call`` is not the legacy one (``None``: it can)."""
    for extension in _extensions(spec.algorithm, extensions):
        if extension.is_legacy(call.get(extension.name)):
            continue
        is_static = extension.name in static_names or not hasattr(call.get(extension.name), "shape")
        if not spec_takes(spec, extension, static=is_static):
            return extension.refusal(spec.algorithm)
    return None


def gate_reason(spec: KernelSpec, call: Mapping[str, Any],
                extensions: tuple[Extension, ...] | None = None) -> str | None:
    """``spec``'s verdict on ``call``: its own capability gate on the call fitted to the gate's signature
    first (its reason, e.g. a dtype it never runs, says more than a missing argument), then the extension
    arguments it does not take (``None``: it accepts)."""
    if spec.capability is not None:
        reason = capability_reason(spec, fit_call(spec.capability, call, spec.algorithm, extensions))
        if reason is not None:
            return reason
    return extension_refusal(spec, call, extensions=extensions)
