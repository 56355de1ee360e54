"""ejk-pallas: Pallas kernels for ejk (Triton lowering and Mosaic GPU on NVIDIA, Mosaic on TPU).

Kernels arrive in their own issue; today the plugin reports whether Pallas can run here.
"""
