"""Op definitions: an operation is declared once, and everything else derives from it.

An :class:`OpDefinition` ties together the op's kernel (its argument layout and validator,
:meth:`~ejk.ops.OpKernel.normalize`), its public function, its plain reference, its conformance
check, how it splits over sharded inputs, what ``ejk bench`` measures and the residual formats
its implementations share. ``ejk.<name>``, :func:`ejk.explain`, :func:`ejk.testing.check_op`,
``ejk kernels``, ``ejk bench`` and the sharded path all read the definitions, so a new op (built
in or from a third party) is a kernel class, a public function and one :func:`define_op` call.
Everything but the kernel and the function may be given as ``"module:attribute"``, imported on
first use (keeps ``import ejk`` light).
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ejk import _contract
from ejk.ops._base import OpKernel

__all__ = ["OPS", "OpDefinition", "define_op", "get_op"]


_loaded: dict[str, Any] = {}


def _load(target: Any, what: str) -> Any:
    """``target``, or the attribute ``"module:attribute"`` names (imported on first use, then kept)."""
    if not isinstance(target, str):
        return target
    if target in _loaded:
        return _loaded[target]
    module, _, attribute = target.partition(":")
    if not attribute:
        raise ValueError(f"{what} {target!r} must be a value or 'module:attribute'")
    value = _loaded[target] = getattr(importlib.import_module(module), attribute)
    return value


def _resolve(target: Callable[..., Any] | str | None, what: str) -> Callable[..., Any] | None:
    value = _load(target, what)
    if value is not None and not callable(value):
        raise TypeError(f"{what} {target!r} is not callable")
    return value  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class OpDefinition:
    """One public operation.

    Attributes:
        kernel: The op's kernel: ``op_id`` is the op's name, ``array_names`` / ``positional`` the
            argument layout implementations receive, ``normalize`` the validator.
        function: The public function (``ejk.<name>``).
        reference: The plain reference implementation.
        check: Conformance check ``check(platform, **options) -> cases run`` that a plugin's test
            suite calls.
        shard_rule: ``rule(arrays, axes_of, size) -> ShardPlan | None``: which sharded dims of
            its inputs a call splits and how the shards combine (``None``: inputs are gathered;
            see :mod:`ejk.ops._sharded`).
        bench: What ``ejk bench`` measures (an :class:`ejk.ops._workload.OpBench`).
        residuals: The residual formats (``ejk.VJP.residuals`` tags) its implementations share,
            so that one's backward may run on another's forward.
        samples: ``samples() -> [(args, kwargs), ...]``: small calls of the public function (arrays
            may be ``jax.ShapeDtypeStruct``) on which ``ejk doctor`` and
            :func:`ejk.testing.check_plugin` run every implementation's gate, heuristic, config
            space and abstract output; the first also tells the op's static arguments.
        output: ``output(*arrays, **static)`` in the implementations' view (every array of
            ``kernel.array_names`` positionally): the abstract output of a call (``None``: ``jax.eval_shape``
            of ``reference`` called as the implementations are). Every implementation's output is
            checked against it, once per trace.

    The op's call contract (:meth:`call_contract`: positional and keyword arrays, static arguments,
    ``cfg``) is what every implementation must accept; a registration that cannot is refused.

    A variant of another op (``variant_of``: its kernel's) gets implementations derived from that
    op's; ``variants`` lists an op's variants.
    """

    kernel: OpKernel
    function: Callable[..., Any] = attrs.field(eq=False)
    reference: Callable[..., Any] | str | None = attrs.field(default=None, eq=False)
    check: Callable[..., int] | str | None = attrs.field(default=None, eq=False)
    shard_rule: Callable[..., Any] | str | None = attrs.field(default=None, eq=False)
    bench: Any = attrs.field(default=None, eq=False)
    residuals: tuple[str, ...] = ()
    samples: Callable[[], Sequence[tuple[tuple[Any, ...], dict[str, Any]]]] | str | None = attrs.field(
        default=None, eq=False)
    output: Callable[..., Any] | str | None = attrs.field(default=None, eq=False)

    @property
    def name(self) -> str:
        return self.kernel.op_id

    @property
    def variant_of(self) -> str | None:
        """The op this one is a variant of (its implementations provide this one's, see
        :meth:`ejk.ops.OpKernel.derive`), else ``None``."""
        return self.kernel.variant_of

    @property
    def variants(self) -> tuple[str, ...]:
        """The defined ops that are variants of this one (``flash_attention_lse`` of ``flash_attention``)."""
        return tuple(name for name, d in OPS.items() if d.variant_of == self.name)

    def reference_fn(self) -> Callable[..., Any] | None:
        return _resolve(self.reference, "reference")

    def check_fn(self) -> Callable[..., int] | None:
        return _resolve(self.check, "check")

    def shard_rule_fn(self) -> Callable[..., Any] | None:
        return _resolve(self.shard_rule, "shard_rule")

    def bench_spec(self) -> Any:
        """The op's :class:`ejk.ops._workload.OpBench` (``None``: ``ejk bench`` does not measure it)."""
        return _load(self.bench, "bench")

    def sample_calls(self) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """The op's sample calls of its public function (empty when it declares none)."""
        samples = _resolve(self.samples, "samples")
        return [] if samples is None else [(tuple(args), dict(kwargs)) for args, kwargs in samples()]

    def static_names(self) -> tuple[str, ...] | None:
        """The static keyword arguments implementations receive: those of the first sample call's
        :meth:`~ejk.ops.OpKernel.normalize`, else the validator's keyword-only parameters
        (``None`` when neither tells)."""
        calls = self.sample_calls()
        if calls:
            args, kwargs = calls[0]
            return tuple(self.kernel.normalize(*args, **kwargs)[1])
        try:
            params = inspect.signature(self.kernel.normalize).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params):
            return None
        return tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY and p.name not in self.kernel.array_names)

    def call_contract(self) -> _contract.CallContract | None:
        """How the core calls every implementation of this op (``None``: its static arguments are unknown)."""
        static = self.static_names()
        if static is None:
            return None
        kernel = self.kernel
        return _contract.CallContract(algorithm=self.name, positional=kernel.array_names[:kernel.positional],
                                      keyword_arrays=kernel.array_names[kernel.positional:], static=static,
                                      extensions=tuple(kernel.extensions))

    def output_fn(self) -> Callable[..., Any] | None:
        """``f(*arrays, **static)`` → the abstract output of a call in the implementations' view
        (``None``: the op declares neither ``output`` nor ``reference``)."""
        output = _resolve(self.output, "output")
        if output is not None:
            return output
        reference = self.reference_fn()
        if reference is None:
            return None
        kernel = self.kernel

        def from_reference(*arrays: Any, **static: Any) -> Any:
            import jax

            def call(*given: Any) -> Any:
                named = dict(zip(kernel.array_names[kernel.positional:], given[kernel.positional:], strict=True))
                return reference(*given[:kernel.positional], **named, **static)

            return jax.eval_shape(call, *arrays)

        return from_reference


#: Every defined operation by name (the built-in ones and those third-party plugins define).
OPS: dict[str, OpDefinition] = {}
_lock = threading.Lock()


def define_op(kernel: OpKernel, function: Callable[..., Any], *, reference: Callable[..., Any] | str | None = None,
              check: Callable[..., int] | str | None = None, shard_rule: Callable[..., Any] | str | None = None,
              bench: Any = None, residuals: tuple[str, ...] = (),
              samples: Callable[[], Sequence[tuple[tuple[Any, ...], dict[str, Any]]]] | str | None = None,
              output: Callable[..., Any] | str | None = None) -> OpDefinition:
    """Declare an operation (see :class:`OpDefinition` for the arguments); returns its definition.

    Raises:
        ValueError: when another operation already uses the name, or the name is not an identifier.
    """
    name = kernel.op_id
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"op name {name!r} must be a public Python identifier (it becomes ejk.{name})")
    definition = OpDefinition(kernel=kernel, function=function, reference=reference, check=check,
                              shard_rule=shard_rule, bench=bench, residuals=tuple(residuals), samples=samples,
                              output=output)
    with _lock:
        existing = OPS.get(name)
        if existing is not None and existing.function is not function:
            raise ValueError(f"an operation named {name!r} is already defined by "
                             f"{getattr(existing.function, '__module__', '?')}; choose another name")
        OPS[name] = definition
    kernel.definition = type(kernel).definition = definition
    _contract.declare(name, definition.call_contract)  # registrations are checked against it from now on
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
