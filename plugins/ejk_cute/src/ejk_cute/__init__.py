"""ejk-cute: CUTLASS CuTe DSL kernels for ejk (NVIDIA Hopper, sm_90, and newer).

``matmul`` (``cute/gpu:wgmma``), ``grouped_matmul`` (``cute/gpu:grouped``) and a FlashAttention-3-style
forward for ``flash_attention`` / ``flash_attention_lse`` (``cute/gpu:fa3``, its backward paired with
another plugin's). CUTLASS is imported lazily, so this package imports without it and reports why it
cannot run. See the plugin's README.
"""
