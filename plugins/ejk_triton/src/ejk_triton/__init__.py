"""ejk-triton: Triton kernels for ejk, called through jax-triton (NVIDIA GPUs).

Kernels arrive in their own issue; today the plugin reports whether Triton can run here.
Triton and jax-triton are imported lazily, so this package imports without them.
"""
