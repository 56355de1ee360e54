"""The call contract of an op: how the core calls every implementation of it.

An op declared with :func:`ejk.ops.define_op` calls each implementation as
``impl(*positional, **keyword_arrays, **static, cfg=cfg)``, its VJP's forward the same way and its
backward as ``bwd(residuals, cotangent, cfg=cfg, **static)``. The op layer declares the contract
(:func:`declare`); the registry checks each registration against it (:func:`contract_of`) and refuses
one that cannot take the call, so a wrong signature fails at registration, against its plugin, and
never in a user's call.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import attrs

from ejk._kernel_spec import VJP

__all__ = ["CallContract", "contract_of", "declare", "generation"]


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

    def describe(self) -> str:
        """The call as the core makes it, e.g. ``impl(a, b, *, precision, preferred_element_type, cfg)``."""
        keywords = (*self.keyword_arrays, *self.static, "cfg")
        return f"impl({', '.join((*self.positional, '*', *keywords))})"

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
        annotations are the implementation's own business."""
        keywords = (*self.keyword_arrays, *self.static, "cfg")
        found = []
        parts: list[tuple[str, Callable[..., Any], int, tuple[str, ...]]] = [
            ("forward", implementation, len(self.positional), keywords)]
        if vjp is not None:
            parts.append(("VJP fwd", vjp.fwd, len(self.positional), keywords))
            if vjp.bwd is not None:
                parts.append(("VJP bwd", vjp.bwd, 2, ("cfg", *self.static)))
        for what, fn, positional, names in parts:
            problem = self._bind_problem(fn, positional, names)
            if problem is not None:
                found.append(f"its {what} {_describe(fn)} cannot be called as "
                             f"{self.describe() if what != 'VJP bwd' else self._describe_bwd()}: {problem}")
        return found

    def _describe_bwd(self) -> str:
        return f"bwd(residuals, cotangent, *, {', '.join(('cfg', *self.static))})"


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
