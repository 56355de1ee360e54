"""ejk-pallas: Pallas kernels for ejk.

Today: ``flash_attention`` forward and backward for NVIDIA GPUs through Pallas's Triton lowering
(``pallas/gpu:triton_lowered``), runnable on the CPU in interpret mode (``EJK_PALLAS_INTERPRET=1``)
for tests. Mosaic GPU and Mosaic TPU kernels are still to come (issue 9).
"""
