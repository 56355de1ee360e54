"""A one-block copy kernel: the smallest thing to push through the compile path (imports CUTLASS).

No ``from __future__ import annotations`` here: the DSL reads the annotations as types.
"""

import cuda.bindings.driver as cuda
import cutlass.cute as cute


@cute.kernel
def _copy(src: cute.Tensor, dst: cute.Tensor) -> None:
    i, _, _ = cute.arch.thread_idx()
    dst[i] = src[i]


@cute.jit
def launch(stream: cuda.CUstream, src: cute.Tensor, dst: cute.Tensor) -> None:
    _copy(src, dst).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)
