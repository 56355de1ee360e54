"""What the matmul-like kernels share: dot precision, operand dtypes, tile shared memory, the gate's common part.

Precision (``docs/KERNEL_CONTRACT.md``): the op layer passes a pair of ``lax.Precision`` names;
the higher of the two decides how ``tl.dot`` multiplies float32 operands: ``"highest"`` is
IEEE float32 (``input_precision="ieee"``, exact products, on the FMA units), ``"high"`` is
``"tf32x3"`` (three TF32 products, about float32 accuracy), ``"default"`` is one TF32 product
(what XLA does on NVIDIA GPUs). bfloat16 and float16 products are exact in the float32
accumulator whatever the precision. So every precision is honoured, and the gate refuses only
dtypes and sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ejk_triton import _device, _env

__all__ = ["DTYPES", "EPILOGUE_STAGING", "MAX_ELEMENTS", "common_dtype", "dot_precision", "gate", "smem_bytes"]

#: Operand dtypes the kernels take.
DTYPES = ("bfloat16", "float16", "float32")
#: Largest operand or output (elements): the kernels index with int32 offsets (with room for a tile's overhang).
MAX_ELEMENTS = 2**30

_LEVEL = {"default": 0, "high": 1, "highest": 2}
_DOT_PRECISION = ("tf32", "tf32x3", "ieee")


def dot_precision(dtype: Any, precision: str | Sequence[str]) -> str:
    """``tl.dot``'s ``input_precision`` for operands of ``dtype`` under ``precision`` (a name or a pair)."""
    if jnp.dtype(dtype) != jnp.float32:
        return "tf32"  # ignored by 16-bit dots (their products are exact)
    names = (precision,) if isinstance(precision, str) else tuple(precision)
    return _DOT_PRECISION[max(_LEVEL[str(name).lower()] for name in names)]


def common_dtype(*arrays: Any) -> np.dtype[Any]:
    """The dtype both operands of one ``tl.dot`` are cast to (``tl.dot`` takes one dtype)."""
    return np.dtype(jnp.result_type(*(x.dtype for x in arrays)))


#: Shared memory a flattened (persistent) kernel's epilogue stages its output through, on top of
#: the main loop's ring: the loads of the next tile are in flight then, so the two cannot share.
#: The most sm_90 compiles measured (128x256 and 128x128 tiles at 8 warps; 8-16 KiB at 4 warps).
EPILOGUE_STAGING = 32 * 1024


def smem_bytes(block_m: int, block_n: int, block_k: int, stages: int, itemsize: int, *, flattened: bool = False) -> int:
    """Shared memory of a pipelined ``[block_m, block_k] x [block_k, block_n]`` main loop (bytes), plus
    :data:`EPILOGUE_STAGING` when the tile loop is ``flattened`` into it."""
    ring = stages * (block_m * block_k + block_k * block_n) * itemsize
    return ring + (EPILOGUE_STAGING if flattened else 0)


def gate(named: Sequence[tuple[str, Any]], outputs: Sequence[tuple[str, int]], *,
         int64_offsets: bool = False) -> str | None:
    """The part of a capability gate every matmul-like kernel shares.

    Args:
        named: ``(name, array)`` operands (anything with ``.shape`` and ``.dtype``).
        outputs: ``(name, elements)`` of the outputs (and gradients) the kernels write.
        int64_offsets: The kernels index with int64: no size limit.

    Returns:
        Why the kernels cannot run the call, or ``None``.
    """
    for name, x in named:
        dtype = jnp.dtype(x.dtype).name
        if dtype not in DTYPES:
            return f"{name} of dtype {dtype} not supported (bfloat16, float16 and float32 only)"
    sizes = [(name, int(np.prod(x.shape, dtype=np.int64))) for name, x in named] + list(outputs)
    for name, size in sizes:
        if size >= MAX_ELEMENTS and not int64_offsets:
            return f"{name} has {size} elements; the kernels index with int32 (fewer than 2**30 elements each)"
    if _env.interpret_mode():
        return None
    on_gpu, why = _env.nvidia_gpu()
    if not on_gpu:
        return f"needs an NVIDIA GPU ({why})"
    return _device.compute_capability_reason()
