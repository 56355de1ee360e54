"""CuTe DSL kernels (device code and their ``@cute.jit`` launchers). Each module imports CUTLASS at import.

Import them only through the JAX-side modules (``ejk_cute._matmul``, ...), which do so lazily on
first trace. The DSL reads annotations as types, so these modules do not use
``from __future__ import annotations``; its idioms (struct fields annotated with values,
``Constexpr`` parameters) are beyond mypy, which checks them leniently (pyproject.toml).
"""
