"""What the matmul-like Pallas kernels share: dtypes, dot precision, padding, the gates' common part.

Precision (``docs/KERNEL_CONTRACT.md``): the op layer passes a pair of ``lax.Precision`` names.
Compiled for an NVIDIA GPU, float32 operands use a dot algorithm: ``"highest"`` is IEEE float32,
``"high"`` three TF32 products (about float32 accuracy), ``"default"`` one TF32 product (what XLA
does). On a TPU and in interpret mode the pair goes to ``dot_general`` as is. bfloat16 and
float16 products are exact in the float32 accumulator whatever the precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ejk_pallas import _env

__all__ = ["DTYPES", "MAX_ELEMENTS", "common_dtype", "dot", "gpu_gate", "out_struct", "pad_to", "tpu_gate"]

#: Operand dtypes the kernels take.
DTYPES = ("bfloat16", "float16", "float32")
#: Largest operand or output (elements): the GPU kernels index with int32 offsets.
MAX_ELEMENTS = 2**30

_LEVEL = {"default": 0, "high": 1, "highest": 2}


def common_dtype(*arrays: Any) -> np.dtype[Any]:
    """The dtype both operands of one dot are cast to."""
    return np.dtype(jnp.result_type(*(x.dtype for x in arrays)))


def _level(precision: Any) -> int:
    names = (precision,) if isinstance(precision, str) else tuple(precision)
    return max(_LEVEL[str(getattr(n, "name", n)).lower()] for n in names)


def dot(a: Any, b: Any, dims: tuple[Any, Any], precision: Any, *, gpu: bool) -> Any:
    """``dot_general(a, b)`` with float32 accumulation; ``precision`` a name or a pair of names.

    ``gpu``: the kernel is lowered through Triton (compiled), where float32 operands take a dot
    algorithm (see the module docstring); else the pair of ``lax.Precision`` goes through.
    """
    level = _level(precision)
    if gpu and a.dtype == jnp.float32 and not _env.use_interpreter():
        preset = lax.DotAlgorithmPreset
        algo = (preset.TF32_TF32_F32, preset.TF32_TF32_F32_X3, preset.F32_F32_F32)[level]
        return lax.dot_general(a, b, dims, precision=algo, preferred_element_type=jnp.float32)
    prec = (lax.Precision.DEFAULT, lax.Precision.HIGH, lax.Precision.HIGHEST)[level]
    return lax.dot_general(a, b, dims, precision=(prec, prec), preferred_element_type=jnp.float32)


def out_struct(shape: Sequence[int], dtype: Any, like: Any) -> jax.ShapeDtypeStruct:
    """A ``pallas_call`` output typed like the input ``like``: under ``jax.shard_map`` (``check_vma``) it
    varies along the same mesh axes (the op layer makes every input vary alike); elsewhere a plain one."""
    manual = getattr(jax.typeof(like), "manual_axis_type", None)
    if manual is None:
        return jax.ShapeDtypeStruct(tuple(shape), dtype)
    return jax.ShapeDtypeStruct(tuple(shape), dtype, manual_axis_type=manual)


def pad_to(x: jax.Array, sizes: Sequence[int]) -> jax.Array:
    """``x`` zero-padded at the end of each dim to ``sizes`` (no copy when nothing to pad)."""
    widths = [(0, int(s) - int(n)) for n, s in zip(x.shape, sizes, strict=True)]
    return x if all(w == 0 for _, w in widths) else jnp.pad(x, widths)


def _dtypes_and_sizes(named: Sequence[tuple[str, Any]], outputs: Sequence[tuple[str, int]],
                      out_dtype: Any) -> str | None:
    for name, x in named:
        dtype = jnp.dtype(x.dtype).name
        if dtype not in DTYPES:
            return f"{name} of dtype {dtype} not supported (bfloat16, float16 and float32 only)"
    if out_dtype is not None and jnp.dtype(out_dtype).name not in DTYPES:
        return f"preferred_element_type {jnp.dtype(out_dtype).name} not supported (bfloat16, float16, float32)"
    sizes = [(name, int(np.prod(x.shape, dtype=np.int64))) for name, x in named] + list(outputs)
    for name, size in sizes:
        if size >= MAX_ELEMENTS:
            return f"{name} has {size} elements; the kernels index with int32 (fewer than 2**30 elements each)"
    return None


def gpu_gate(named: Sequence[tuple[str, Any]], outputs: Sequence[tuple[str, int]], out_dtype: Any) -> str | None:
    """The common part of the Triton-lowered kernels' gates: dtypes, sizes, an NVIDIA GPU (sm_80+)."""
    why = _dtypes_and_sizes(named, outputs, out_dtype)
    if why is not None or _env.use_interpreter():
        return why
    on_gpu, reason = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({reason})"
    raw = str(getattr(jax.devices()[0], "compute_capability", "") or "")
    try:
        major = int(raw.split(".")[0])
    except ValueError:
        return None
    return None if major >= 8 else f"needs an NVIDIA GPU of compute capability 8.0 or newer (found {raw})"


def tpu_gate(named: Sequence[tuple[str, Any]], outputs: Sequence[tuple[str, int]], out_dtype: Any) -> str | None:
    """The common part of the Mosaic TPU kernels' gates: dtypes, sizes, a TPU (or interpret mode)."""
    why = _dtypes_and_sizes(named, outputs, out_dtype)
    if why is not None or _env.use_interpreter():
        return why
    if jax.default_backend() != "tpu":
        return f"needs a TPU (JAX's default backend is {jax.default_backend()})"
    return None
