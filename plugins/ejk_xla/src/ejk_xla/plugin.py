"""The ``xla`` entry point: registers the XLA implementations with their configs and gates."""

from __future__ import annotations

from ejk.plugin import Backend, Platform, PlatformStatus, RegisterKernels, Tier, hookimpl
from ejk_xla import (
    _cudnn_attention,
    _cudnn_varlen,
    _flash_attention,
    _gated_delta_rule,
    _gla,
    _grouped_gate,
    _grouped_matmul,
    _lce_grad_in_forward,
    _linear_cross_entropy,
    _matmul,
    _mla_attention,
    _paged_attention,
    _rms_norm,
    _ssd,
    _varlen_attention,
)

#: Tie-break of cuDNN attention inside the VENDOR tier (first wherever its gate allows).
CUDNN_PRIORITY = 10

#: The other platforms of the ejk family, for the "what to install" hint of a missing platform.
SIBLING_DISTRIBUTIONS = {"pallas": "ejk-pallas", "triton": "ejk-triton", "cute": "ejk-cute"}


@hookimpl
def ejk_register_kernels(register: RegisterKernels) -> None:
    portable = (Platform.XLA, Backend.ANY)
    fallback = Tier.PORTABLE  # pure XLA: runs everywhere, the kernels' fallback
    vendor = Tier.VENDOR  # XLA's dot (cuBLAS on NVIDIA GPUs) and cuDNN: the baselines kernels must beat
    fa = _flash_attention
    register("flash_attention", *portable, tier=fallback, name="chunked", cfg_type=fa.FlashAttentionConfig,
             config_space=fa.config_space, heuristic=fa.heuristic_config)(fa.flash_attention)
    # Registered for the lse variant itself: the chunked kernel differentiates through its own custom_vjp
    # (no ejk.VJP, and its lse is blocked internally), so the core cannot derive the variant from it.
    register("flash_attention_lse", *portable, tier=fallback, name="chunked", cfg_type=fa.FlashAttentionConfig,
             config_space=fa.config_space, heuristic=fa.heuristic_config)(fa.flash_attention_lse)
    register("flash_attention", Platform.XLA, Backend.GPU, priority=CUDNN_PRIORITY, tier=vendor, name="cudnn",
             capability=_cudnn_attention.capability)(_cudnn_attention.cudnn_attention)
    register("matmul", *portable, tier=vendor, name="dot", cfg_type=_matmul.MatmulConfig,
             config_space=_matmul.config_space, heuristic=_matmul.heuristic_config, vjp=_matmul.vjp)(_matmul.matmul)
    va = _varlen_attention
    register("flash_attention_varlen", *portable, tier=fallback, name="chunked", cfg_type=va.VarlenAttentionConfig,
             config_space=va.config_space, heuristic=va.heuristic_config)(va.flash_attention_varlen)
    register("flash_attention_varlen", Platform.XLA, Backend.GPU, priority=CUDNN_PRIORITY, tier=vendor, name="cudnn",
             capability=_cudnn_varlen.capability)(_cudnn_varlen.cudnn_varlen_attention)
    gmm, pa = _grouped_matmul, _paged_attention
    register("grouped_matmul", *portable, tier=fallback, name="tiled", cfg_type=gmm.GroupedMatmulConfig,
             config_space=gmm.config_space, heuristic=gmm.heuristic_config)(gmm.grouped_matmul)
    # Gated calls: the plain product by auto's choice, then the activation (after the fused ones unless ranked).
    register("grouped_matmul", *portable, priority=-1, tier=fallback, name="composed",
             capability=_grouped_gate.capability)(_grouped_gate.grouped_matmul_then_gate)
    register("ragged_paged_attention", *portable, tier=fallback, name="paged", cfg_type=pa.PagedAttentionConfig,
             config_space=pa.config_space, heuristic=pa.heuristic_config)(pa.ragged_paged_attention)
    mla = _mla_attention
    register("mla_paged_attention", *portable, tier=fallback, name="paged", cfg_type=mla.MlaAttentionConfig,
             config_space=mla.config_space, heuristic=mla.heuristic_config)(mla.mla_paged_attention)
    gdr = _gated_delta_rule  # differentiated by JAX's autodiff of the chunked algorithm (no ejk.VJP)
    register("gated_delta_rule", *portable, tier=fallback, name="chunked", cfg_type=gdr.GatedDeltaRuleConfig,
             config_space=gdr.config_space, heuristic=gdr.heuristic_config)(gdr.gated_delta_rule)
    register("gla", *portable, tier=fallback, name="chunked", cfg_type=_gla.GlaConfig,
             config_space=_gla.config_space, heuristic=_gla.heuristic_config, vjp=_gla.vjp)(_gla.gla)
    register("ssd", *portable, tier=fallback, name="chunked", cfg_type=_ssd.SsdConfig,
             config_space=_ssd.config_space, heuristic=_ssd.heuristic_config, vjp=_ssd.vjp)(_ssd.ssd)
    lce, norm = _linear_cross_entropy, _rms_norm
    register("linear_cross_entropy", *portable, tier=fallback, name="chunked", cfg_type=lce.LinearCrossEntropyConfig,
             config_space=lce.config_space, heuristic=lce.heuristic_config, vjp=lce.vjp)(lce.linear_cross_entropy)
    # Three products instead of four when differentiated; below the chunked one until measured (ranking packs).
    gif = _lce_grad_in_forward
    register("linear_cross_entropy", *portable, priority=-1, tier=fallback, name="grad_in_forward",
             cfg_type=gif.GradInForwardConfig, capability=gif.capability, config_space=gif.config_space,
             heuristic=gif.heuristic_config, vjp=gif.vjp)(gif.linear_cross_entropy)
    # XLA fuses a row-wise norm well: the baseline a GPU kernel must beat.
    register("rms_norm", *portable, tier=vendor, name="fused", cfg_type=norm.RmsNormConfig,
             config_space=norm.config_space, heuristic=norm.heuristic_config, vjp=norm.vjp)(norm.rms_norm)


@hookimpl
def ejk_platform_status() -> PlatformStatus:
    import jax

    return PlatformStatus(platform="xla", available=True, versions={"jax": jax.__version__})


@hookimpl
def ejk_platform_distributions() -> dict[str, str]:
    return SIBLING_DISTRIBUTIONS
