"""ejk-pallas: Pallas kernels for ejk.

Today: ``flash_attention`` forward and backward for NVIDIA GPUs through Pallas's Triton lowering
(``pallas/gpu:triton_lowered``), runnable on the CPU in interpret mode (``EJK_PALLAS_INTERPRET=1``)
for tests; and the same op as Mosaic TPU kernels (``pallas/tpu:mosaic_tpu``, untested on TPU
hardware, checked in the TPU interpret mode). Mosaic GPU kernels are still to come (issue 9).
"""
