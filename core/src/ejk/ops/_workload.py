"""What an op gives ``ejk bench``: its case type, its workload, its presets and its shape syntax.

An op's folder defines a :class:`Case` subclass (one shape), a :class:`Workload` subclass (the
inputs, the public call and the work it does) and an :class:`OpBench` tying them to the presets
and the ``--shapes`` spec of the command line; its :class:`~ejk.ops.OpDefinition` names the
``OpBench`` (``define_op(..., bench=)``), and :mod:`ejk.bench` reads it from there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["GBPS", "MODES", "TFLOPS", "Case", "OpBench", "Workload", "dims", "int_options", "normal",
           "with_backward"]

MODES = ("fwd", "fwd+bwd")
TFLOPS, GBPS = "TFLOP/s", "GB/s"


@attrs.frozen(kw_only=True)
class Case:
    """One shape of one op. Subclasses name the op and say where the case sits on a plot.

    ``series`` groups the cases of one curve (every parameter but the swept one); ``x`` is
    the swept value, ``x_name`` what it means.
    """

    op: ClassVar[str] = ""
    x_name: ClassVar[str] = ""

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def series(self) -> str:
        raise NotImplementedError

    @property
    def x(self) -> int:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.label


def with_backward(fn: Callable[..., Any], diff: tuple[int, ...]) -> Callable[..., Any]:
    """``g(*args, ct) -> (out, grads)``: ``fn``'s output and its VJP for cotangent ``ct``
    with respect to the arguments at positions ``diff``, in one function."""

    def forward_backward(*args: Any) -> Any:
        *arrays, ct = args

        def of_diff(*values: Any) -> Any:
            merged = list(arrays)
            for i, value in zip(diff, values, strict=True):
                merged[i] = value
            return fn(*merged)

        out, vjp = jax.vjp(of_diff, *(arrays[i] for i in diff))
        return out, vjp(ct)

    return forward_backward


@functools.lru_cache(maxsize=64)
def fixed_kwargs(workload: Workload) -> dict[str, Any]:
    """``workload.kwargs()``, made once: the same arrays (offsets, ``D``…) at every call, as a caller
    keeps them, so that an eager call's time holds no array creation (do not modify the dict)."""
    return workload.kwargs()


def normal(key: jax.Array, shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> jax.Array:
    """Standard normal values (times ``scale``) of ``shape`` in ``dtype``."""
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


@attrs.frozen(kw_only=True)
class Workload:
    """One case at one dtype: inputs, the call of the public op, the work per mode.

    Attributes:
        case: The shape.
        dtype: Element type of the floating inputs.
    """

    case: Case
    dtype: np.dtype[Any] = attrs.field(converter=np.dtype)

    @property
    def op(self) -> str:
        return self.case.op

    #: The modes this op is measured in.
    modes: tuple[str, ...] = MODES
    #: Positions of the differentiable inputs.
    diff: tuple[int, ...] = ()

    def inputs(self, seed: int = 0) -> tuple[Any, ...]:
        """The public op's positional array arguments (random, on the default device)."""
        raise NotImplementedError

    def kwargs(self) -> dict[str, Any]:
        """The public op's keyword arguments (besides ``platform`` and ``cfg``)."""
        return {}

    def split_inputs(self, inputs: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The public op's ``(positional arrays, keyword arguments)`` for ``inputs``: all of them positional and
        :meth:`kwargs`, unless a workload passes some array (e.g. attention sinks) by keyword."""
        return tuple(inputs), fixed_kwargs(self)

    def normalize(self, inputs: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The implementations' ``(arrays, static keyword arguments)`` for ``inputs`` (the op's validation)."""
        from ejk.ops._definition import get_op

        positional, kwargs = self.split_inputs(inputs)
        return get_op(self.op).kernel.normalize(*positional, **kwargs)

    def out_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def work(self, mode: str) -> tuple[float, str]:
        """``(work, unit)``: FLOPs for TFLOP/s, bytes for GB/s."""
        raise NotImplementedError

    def cotangent(self, seed: int = 1) -> jax.Array:
        """A random cotangent of the output (the backward pass's input)."""
        return normal(jax.random.key(seed), self.out_shape(), self.dtype)

    def call(self, *, platform: str = "auto", cfg: Any = None) -> Callable[..., Any]:
        """``f(*inputs)`` calling the public op with ``platform=`` and ``cfg=``."""
        from ejk.ops._definition import get_op

        function = get_op(self.op).function

        def op_call(*arrays: Any) -> Any:
            positional, kwargs = self.split_inputs(arrays)
            return function(*positional, **kwargs, platform=platform, cfg=cfg)

        return op_call


@attrs.frozen(kw_only=True)
class OpBench:
    """An op's part of ``ejk bench``.

    Attributes:
        case: Its :class:`Case` type.
        workload: Its :class:`Workload` type (built as ``workload(case=..., dtype=...)``).
        preset: The name of its presets on the command line, e.g. ``"attention"``.
        aliases: Other names of the op on the command line (the op's name and ``preset`` always work).
        presets: The cases ``--shapes <preset>`` (and ``ejk bench <op>``) measure.
        quick: Tiny cases for ``--quick``.
        parse: ``parse(dims, options, spec) -> Case``: the case of ``--shapes <name>:<dims>[:<options>]``
            (``options`` maps lower-case keys to values, ``""`` for flags; raise ``ValueError``
            naming ``spec`` and the expected form).
    """

    case: type[Case]
    workload: type[Workload]
    preset: str
    aliases: tuple[str, ...] = ()
    presets: tuple[Case, ...]
    quick: tuple[Case, ...]
    parse: Callable[[str, dict[str, str], str], Case] = attrs.field(eq=False)


def dims(text: str, count: int, what: str) -> list[int]:
    """``count`` positive sizes from ``AxBxC``; ``what`` names the expected form in the error."""
    try:
        found = [int(part) for part in text.lower().replace("×", "x").split("x")]
    except ValueError:
        found = []
    if len(found) != count or min(found) <= 0:
        raise ValueError(f"--shapes: {text!r} is not {what}")
    return found


def int_options(options: dict[str, str], allowed: Iterable[str], spec: str) -> dict[str, int]:
    """The positive integer values of ``options``, which may only use the keys ``allowed``."""
    allowed = set(allowed)
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"--shapes {spec!r}: unknown option(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(sorted(allowed))}")
    try:
        values = {key: int(value) for key, value in options.items() if value}
    except ValueError:
        values = {"": 0}
    if min(values.values(), default=1) < 1:
        raise ValueError(f"--shapes {spec!r}: option values must be positive integers")
    return values
