"""ejk-cute: CUTLASS CuTe DSL kernels for ejk (NVIDIA Hopper, sm_90, and newer).

Kernels arrive in their own issue; today the plugin reports whether CuTe DSL can run here.
CUTLASS is imported lazily, so this package imports without it.
"""
