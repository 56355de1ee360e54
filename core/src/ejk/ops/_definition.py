"""Op definitions: an operation is declared once, and everything else derives from it.

An :class:`OpDefinition` ties together the op's kernel (its argument layout and validator,
:meth:`~ejk.ops.OpKernel.normalize`), its public function, its plain reference and its
conformance check. ``ejk.<name>``, :func:`ejk.explain`, :func:`ejk.testing.check_op` and
``ejk kernels`` all read the definitions, so a new op (built in or from a third party) is a
kernel class, a public function and one :func:`define_op` call.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

import attrs

from ejk.ops._base import OpKernel

__all__ = ["OPS", "OpDefinition", "define_op", "get_op"]


def _resolve(target: Callable[..., Any] | str | None) -> Callable[..., Any] | None:
    """A callable, or ``"module:attribute"`` imported on first use (keeps ``import ejk`` light)."""
    if target is None or callable(target):
        return target
    module, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module), attribute)
    if not callable(value):
        raise TypeError(f"{target!r} is not callable")
    return value  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class OpDefinition:
    """One public operation.

    Attributes:
        kernel: The op's kernel: ``op_id`` is the op's name, ``array_names`` / ``positional`` the
            argument layout implementations receive, ``normalize`` the validator.
        function: The public function (``ejk.<name>``).
        reference: The plain reference implementation (a callable or ``"module:attribute"``).
        check: Conformance check ``check(platform, **options) -> cases run`` that a plugin's test
            suite calls (a callable or ``"module:attribute"``).
    """

    kernel: OpKernel
    function: Callable[..., Any] = attrs.field(eq=False)
    reference: Callable[..., Any] | str | None = attrs.field(default=None, eq=False)
    check: Callable[..., int] | str | None = attrs.field(default=None, eq=False)

    @property
    def name(self) -> str:
        return self.kernel.op_id

    def reference_fn(self) -> Callable[..., Any] | None:
        return _resolve(self.reference)

    def check_fn(self) -> Callable[..., int] | None:
        return _resolve(self.check)


#: Every defined operation by name (the built-in ones and those third-party plugins define).
OPS: dict[str, OpDefinition] = {}
_lock = threading.Lock()


def define_op(kernel: OpKernel, function: Callable[..., Any], *, reference: Callable[..., Any] | str | None = None,
              check: Callable[..., int] | str | None = None) -> OpDefinition:
    """Declare an operation; returns its definition.

    Raises:
        ValueError: when another operation already uses the name, or the name is not an identifier.
    """
    name = kernel.op_id
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"op name {name!r} must be a public Python identifier (it becomes ejk.{name})")
    definition = OpDefinition(kernel=kernel, function=function, reference=reference, check=check)
    with _lock:
        existing = OPS.get(name)
        if existing is not None and existing.function is not function:
            raise ValueError(f"an operation named {name!r} is already defined by "
                             f"{getattr(existing.function, '__module__', '?')}; choose another name")
        OPS[name] = definition
    return definition


def get_op(name: str) -> OpDefinition:
    """The definition of operation ``name``.

    Raises:
        ValueError: naming the known operations.
    """
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown operation {name!r}; known: {', '.join(sorted(OPS))}") from None
