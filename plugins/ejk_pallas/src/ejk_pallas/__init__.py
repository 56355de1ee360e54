"""ejk-pallas: Pallas kernels for ejk.

``flash_attention`` (forward and backward), ``ragged_paged_attention``, ``matmul`` and ``grouped_matmul``
for NVIDIA GPUs through Pallas's Triton lowering (``pallas/gpu:triton_lowered``), Mosaic GPU kernels for
Hopper (``pallas/gpu:mosaic``: flash attention, matmul, grouped matmul) and Mosaic TPU kernels
(``pallas/tpu:mosaic_tpu``, untested on TPU hardware). ``EJK_PALLAS_INTERPRET=1`` runs them on the CPU in
Pallas's interpret modes, for tests. See the plugin's README.
"""
