"""Launching a ``@triton.jit`` kernel from JAX: jax-triton on a GPU, the Triton interpreter on the CPU.

Kernels take their input pointers, then their output pointers, then ``constexpr`` keyword
arguments (jax-triton's convention). :func:`launch` picks the path from ``EJK_TRITON_INTERPRET``.

The interpreter path runs inside ``jax.pure_callback``: the callback wraps the host numpy
buffers in :class:`HostTensor`, the few methods of a torch tensor that Triton's interpreter
calls, so torch is not needed.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.custom_batching
import numpy as np

from ejk.plugin import varying_like
from ejk_triton import _env

__all__ = ["HostTensor", "kernels", "launch", "sequential_vmap"]

Grid = tuple[int, ...]
_INTERPRETER_LOCK = threading.Lock()


class _HostStorage:
    """The ``untyped_storage()`` of a :class:`HostTensor`: a flat byte view of its buffer."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer = buffer

    def data_ptr(self) -> int:
        return int(self.buffer.ctypes.data)

    def cpu(self) -> _HostStorage:
        return self

    def copy_(self, other: _HostStorage) -> _HostStorage:
        if other.buffer.ctypes.data != self.buffer.ctypes.data:
            np.copyto(self.buffer, other.buffer)
        return self


class HostTensor:
    """A numpy array seen through the tensor methods Triton's interpreter uses.

    Args:
        array: A C-contiguous array (written in place when it is a kernel output).
    """

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self._storage = _HostStorage(array.reshape(-1).view(np.uint8))
        self._offset = 0

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.array.dtype

    def data_ptr(self) -> int:
        return int(self.array.ctypes.data)

    def untyped_storage(self) -> _HostStorage:
        return self._storage

    def storage_offset(self) -> int:
        return self._offset

    def size(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def new_empty(self, *_: Any, **__: Any) -> HostTensor:
        return HostTensor(np.empty(0, self.array.dtype))

    def set_(self, storage: _HostStorage, offset: int, size: Sequence[int], stride: Sequence[int]) -> HostTensor:
        item = self.array.itemsize
        base = storage.buffer.view(self.array.dtype)[offset:]
        self.array = np.lib.stride_tricks.as_strided(base, shape=tuple(size), strides=tuple(s * item for s in stride))
        self._storage, self._offset = storage, offset
        return self

    def copy_(self, other: HostTensor) -> HostTensor:
        np.copyto(self.array, other.array)
        return self

    def cpu(self) -> HostTensor:
        return self


def _patch_interpreter() -> None:
    """Make the interpreter's ``tl.dot`` read bfloat16 operands as numbers.

    Triton's interpreter (3.6) stores bfloat16 as raw ``uint16`` and multiplies those bits in
    ``tl.dot``; a GPU multiplies the values with float32 accumulation. The patch widens
    bfloat16 operands to float32 first (exact), so the interpreter computes what the GPU does.
    """
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_ejk_bf16_dot", False):
        return
    original = builder.create_dot

    def create_dot(self: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        if a.dtype.scalar == tl.bfloat16:
            a = self.cast_impl(a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = self.cast_impl(b, tl.float32)
        return original(self, a, b, *args, **kwargs)

    builder.create_dot = create_dot
    builder._ejk_bf16_dot = True


def _unwritten(shape: tuple[int, ...], dtype: Any, zeroed: bool) -> np.ndarray:
    """A fresh interpreted output: zeros where asked for, else NaN (floats) or a non-zero pattern (ints), as
    a GPU output buffer holds whatever was there before, so a kernel that relies on zeros it did not
    ask for fails the CPU tests too."""
    if zeroed:
        return np.zeros(shape, dtype)
    if jax.numpy.issubdtype(dtype, jax.numpy.floating):
        return np.full(shape, np.nan, dtype)
    return np.full(shape, 0x5A5A5A5A if np.dtype(dtype).itemsize >= 4 else 0x5A, dtype)


def _interpret(kernel: Any, grid: Grid, inputs: Sequence[jax.Array], out_shapes: Sequence[jax.ShapeDtypeStruct],
               zeroed_outputs: Sequence[int], constexprs: Mapping[str, Any]) -> tuple[jax.Array, ...]:
    _patch_interpreter()

    def host(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        ins = [HostTensor(np.ascontiguousarray(a)) for a in arrays]
        outs = [_unwritten(s.shape, s.dtype, i in zeroed_outputs) for i, s in enumerate(out_shapes)]
        # The interpreter keeps global state (the grid index) and XLA may run independent callbacks
        # at once (the dk/dv and dq kernels): one interpreted launch at a time.
        with _INTERPRETER_LOCK, warnings.catch_warnings():
            # Triton 3.6's interpreter turns runtime loop bounds (1-element arrays) into ints.
            warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0 to a scalar",
                                    category=DeprecationWarning)
            kernel[grid](*ins, *(HostTensor(o) for o in outs), **constexprs)
        return tuple(outs)

    result = jax.pure_callback(host, tuple(out_shapes), *inputs, vmap_method="sequential")
    return tuple(result)


def launch(
    kernel: Any,
    *,
    grid: Grid,
    inputs: Sequence[jax.Array],
    out_shapes: Sequence[jax.ShapeDtypeStruct],
    num_warps: int,
    num_stages: int,
    zeroed_outputs: Sequence[int] = (),
    **constexprs: Any,
) -> tuple[jax.Array, ...]:
    """Run ``kernel`` over ``grid``; returns its outputs.

    Args:
        kernel: A ``@triton.jit`` function taking ``*inputs, *outputs, **constexprs``.
        grid: Program grid.
        inputs: Input arrays, in the kernel's order.
        out_shapes: Shapes and dtypes of the outputs.
        num_warps: Warps per program (ignored by the interpreter).
        num_stages: Software-pipelining stages (ignored by the interpreter).
        zeroed_outputs: Indices of outputs that must start as zeros (each costs a memset before the
            launch); the others start with whatever the buffer held (NaN in the interpreter).
        **constexprs: The kernel's ``constexpr`` arguments.
    """
    if _env.interpret_mode():
        return varying_like(_interpret(kernel, grid, inputs, out_shapes, tuple(zeroed_outputs), constexprs), *inputs)
    try:
        import jax_triton as jt
    except ImportError as exc:  # the platform reports itself unavailable; a forced platform lands here
        raise RuntimeError(
            f"ejk-triton needs jax-triton to launch kernels on a GPU ({exc}); pip install jax-triton "
            f"(0.3.1 with triton 3.6, 0.4.x with triton >= 3.7), or set {_env.INTERPRET_ENV}=1 for the interpreter"
        ) from exc

    outs = jt.triton_call(
        *inputs, kernel=kernel, out_shape=list(out_shapes), grid=grid, num_warps=num_warps,
        num_stages=num_stages, zeroed_outputs=tuple(zeroed_outputs), **constexprs,
    )
    return varying_like(tuple(outs), *inputs)


def sequential_vmap(fn: Callable[..., tuple[jax.Array, ...]]) -> Callable[..., tuple[jax.Array, ...]]:
    """``fn`` (arrays in, a tuple of arrays out) with a vmap rule that runs it once per mapped element.

    jax-triton's call has no batching rule; under ``jax.vmap`` the mapped arguments are sliced by a
    ``lax.map`` (one launch per element, in sequence) and the unmapped ones passed whole. Kernels
    that can fold the mapped axis into a launch of their own do better with their own rule.
    """
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def rule(axis_size: int, in_batched: Any, *args: Any) -> tuple[tuple[jax.Array, ...], tuple[bool, ...]]:
        del axis_size
        mapped = [x for x, b in zip(args, in_batched, strict=True) if b]

        def one(slices: list[jax.Array]) -> tuple[jax.Array, ...]:
            it = iter(slices)
            return tuple(wrapped(*(next(it) if b else x for x, b in zip(args, in_batched, strict=True))))

        outs = tuple(jax.lax.map(one, mapped))
        return outs, tuple(True for _ in outs)

    return wrapped


def kernels(module: str = "_attention_kernels") -> Any:
    """A kernel module of this package, e.g. ``"_matmul_kernels"`` (imports triton, interpreted when asked for)."""
    _env.import_triton()
    return importlib.import_module(f"ejk_triton.{module}")

