"""The ``triton`` entry point: registers the Triton implementations with their configs, gates and VJPs.

Imports neither triton nor jax-triton: kernels import them when they are first launched.
"""

from __future__ import annotations

from typing import Any

from ejk.plugin import VJP, Platform, PlatformStatus, RegisterKernels, hookimpl
from ejk_triton import (
    _env,
    _flash_attention,
    _gated_delta_rule,
    _grouped_matmul,
    _linear_attention,
    _linear_cross_entropy,
    _matmul,
    _mla_attention,
    _paged_attention,
    _rms_norm,
    _segment_attention,
    _varlen_attention,
)

# Every kernel is in the FAST tier. The priorities below are tie-breaks inside it where no ranking pack
# covers the device; measured orders are the rankings of ejk-core's packs (docs/RANKINGS.md).

#: Attention and paged attention: after the Hopper-only attention kernels, before Triton-lowered Pallas.
PRIORITY = 5
#: flash_attention with segment ids on the varlen kernels, before the flash kernel: it skips the key blocks outside
#: each row's segment, where the flash kernel computes (and masks) every block of the [Sq, Sk] square or triangle.
SEGMENTS_PRIORITY = 6
#: grouped_matmul: first among the grouped kernels.
GROUPED_MATMUL_PRIORITY = 7
#: matmul: after the Mosaic GPU GEMM (Hopper-only), before Triton-lowered Pallas.
MATMUL_PRIORITY = -5


@hookimpl
def ejk_register_kernels(register: RegisterKernels) -> None:
    fa, pa = _flash_attention, _paged_attention
    # Its backward takes the lse cotangent too: ejk.flash_attention_lse comes with it.
    vjp = VJP(fwd=fa.forward_with_residuals, bwd=fa.backward, residuals=fa.RESIDUALS, extra_cotangents=("lse",))
    for backend in _env.backends():
        register("flash_attention", Platform.TRITON, backend, priority=PRIORITY, name="flash",
                 cfg_type=fa.FlashAttentionConfig, config_space=fa.config_space, heuristic=fa.heuristic_config,
                 capability=fa.capability, vjp=vjp)(fa.forward)
        # Not differentiable (serving-time attention), like ejk-xla's: no VJP.
        register("ragged_paged_attention", Platform.TRITON, backend, priority=PRIORITY, name="paged",
                 cfg_type=pa.PagedAttentionConfig, config_space=pa.config_space, heuristic=pa.heuristic_config,
                 capability=pa.capability)(pa.ragged_paged_attention)
        register("mla_paged_attention", Platform.TRITON, backend, priority=PRIORITY, name="mla",
                 cfg_type=_mla_attention.MlaAttentionConfig, config_space=_mla_attention.config_space,
                 heuristic=_mla_attention.heuristic_config,
                 capability=_mla_attention.capability)(_mla_attention.mla_paged_attention)
    va = _varlen_attention
    for backend in _env.backends():
        # Differentiable through its own custom_vjp (dk/dv and dq kernels), like ejk-xla's chunked kernel.
        register("flash_attention_varlen", Platform.TRITON, backend, priority=PRIORITY, name="flash",
                 cfg_type=va.VarlenAttentionConfig, config_space=va.config_space, heuristic=va.heuristic_config,
                 capability=va.capability)(va.flash_attention_varlen)
        # flash_attention calls with segment ids (its gate refuses the others), on the varlen kernels: key blocks
        # outside a row's segment are skipped (SEGMENTS_PRIORITY: before ejk-triton's flash kernel).
        sa = _segment_attention
        register("flash_attention", Platform.TRITON, backend, priority=SEGMENTS_PRIORITY, name="segments",
                 cfg_type=va.VarlenAttentionConfig, config_space=sa.config_space, heuristic=sa.heuristic_config,
                 capability=sa.capability)(sa.flash_attention)
    mm, gmm = _matmul, _grouped_matmul
    for backend in _env.backends():
        register("matmul", Platform.TRITON, backend, priority=MATMUL_PRIORITY, name="gemm",
                 cfg_type=mm.MatmulConfig, config_space=mm.config_space, heuristic=mm.heuristic_config,
                 capability=mm.capability, vjp=mm.vjp)(mm.forward)
        register("grouped_matmul", Platform.TRITON, backend, priority=GROUPED_MATMUL_PRIORITY, name="persistent",
                 cfg_type=gmm.GroupedMatmulConfig, config_space=gmm.config_space, heuristic=gmm.heuristic_config,
                 capability=gmm.capability, vjp=gmm.vjp)(gmm.forward)
        lce = _linear_cross_entropy
        register("linear_cross_entropy", Platform.TRITON, backend, priority=PRIORITY, name="fused",
                 cfg_type=lce.LinearCrossEntropyConfig, config_space=lce.config_space,
                 heuristic=lce.heuristic_config, capability=lce.capability, vjp=lce.vjp)(lce.forward)
        # Fast tier, below ejk-xla's fused RMSNorm (vendor tier): platform="auto" takes it first only where a
        # ranking pack measured it first. Residuals shared with ejk-xla's (RMS_NORM_RESIDUALS).
        norm = _rms_norm
        register("rms_norm", Platform.TRITON, backend, priority=PRIORITY, name="fused", cfg_type=norm.RmsNormConfig,
                 config_space=norm.config_space, heuristic=norm.heuristic_config, capability=norm.capability,
                 vjp=norm.vjp)(norm.forward)
    gdr = _gated_delta_rule  # differentiable through its own custom_vjp (no ejk.VJP: no residual format to share)
    for backend in _env.backends():
        register("gated_delta_rule", Platform.TRITON, backend, priority=PRIORITY, name="chunked",
                 cfg_type=gdr.GatedDeltaRuleConfig, config_space=gdr.config_space, heuristic=gdr.heuristic_config,
                 capability=gdr.capability)(gdr.forward)
    la = _linear_attention  # both with backward kernels; residuals shared with ejk-xla's (the operands)
    for backend in _env.backends():
        register("gla", Platform.TRITON, backend, priority=PRIORITY, name="chunked", cfg_type=la.LinearAttentionConfig,
                 config_space=la.config_space, heuristic=la.heuristic_config, capability=la.capability,
                 vjp=la.gla_vjp)(la.gla)
        register("ssd", Platform.TRITON, backend, priority=PRIORITY, name="chunked", cfg_type=la.LinearAttentionConfig,
                 config_space=la.ssd_config_space, heuristic=la.ssd_heuristic_config, capability=la.ssd_capability,
                 vjp=la.ssd_vjp)(la.ssd)


@hookimpl
def ejk_platform_status() -> PlatformStatus:
    return _env.platform_status()


@hookimpl
def ejk_device_fingerprint(device: Any) -> dict[str, str] | None:
    capability = getattr(device, "compute_capability", None)
    return {"cc": str(capability)} if capability else None
