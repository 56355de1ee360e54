"""The ``cute`` entry point: registers the CuTe DSL implementations with their configs, gates and VJPs.

Imports neither CUTLASS nor a GPU runtime: the kernels import CUTLASS when they are first traced
(``_compile.import_cutlass``), and every gate starts with ``_status.runtime_reason`` (CUTLASS
installed, an sm_90+ GPU), so the plugin loads everywhere and never crashes a call it cannot run.
"""

from __future__ import annotations

from typing import Any

from ejk.plugin import Platform, PlatformStatus, RegisterKernels, hookimpl
from ejk_cute import _grouped_matmul, _matmul, _status
from ejk_cute._flash_attention import register_flash_attention

#: Compute capability the kernels need (wgmma, TMA, clusters); see ``_device``.
MIN_COMPUTE_CAPABILITY = (9, 0)

# Every kernel is in the FAST tier. The priorities below are tie-breaks inside it where no ranking pack
# covers the device; measured orders are the rankings of ejk-core's packs (docs/RANKINGS.md).

#: matmul: level with ejk-triton's GEMM.
MATMUL_PRIORITY = -5
#: grouped_matmul: after ejk-triton's persistent kernel, before ejk-pallas's.
GROUPED_MATMUL_PRIORITY = 6


@hookimpl
def ejk_register_kernels(register: RegisterKernels) -> None:
    """Registers the implementations that have kernels, for the GPU backend only."""
    mm = _matmul
    register("matmul", Platform.CUTE, "gpu", priority=MATMUL_PRIORITY, name="wgmma", cfg_type=mm.MatmulConfig,
             config_space=mm.config_space, heuristic=mm.heuristic_config, capability=mm.capability, vjp=mm.vjp)(
        mm.forward)
    gmm = _grouped_matmul
    register("grouped_matmul", Platform.CUTE, "gpu", priority=GROUPED_MATMUL_PRIORITY, name="grouped",
             cfg_type=gmm.GroupedMatmulConfig, config_space=gmm.config_space, heuristic=gmm.heuristic_config,
             capability=gmm.capability, vjp=gmm.vjp)(gmm.forward)
    register_flash_attention(register)


@hookimpl
def ejk_platform_status() -> PlatformStatus:
    return _status.platform_status()


@hookimpl
def ejk_device_fingerprint(device: Any) -> dict[str, str] | None:
    capability = getattr(device, "compute_capability", None)
    return {"cc": str(capability)} if capability else None
