"""The ``example`` entry point: registrations and hooks only (the logic lives in the modules it names).

Registered implementations:
- ``rms_norm`` ``xla/any:fused`` — a new algorithm, with its public op ``ejk.example_rms_norm`` (``ops``).
- ``matmul`` ``xla/any:split_k`` — a second implementation of ejk's ``matmul`` op.
Hooks: ``ejk_choose_config`` applies the team policy of :mod:`ejk_example.policy`;
``ejk_platform_status`` is required (``ejk.testing.check_plugin`` checks it).
"""

from __future__ import annotations

from typing import Any

from ejk.plugin import (
    VJP,
    Backend,
    Invocation,
    Kernel,
    Platform,
    PlatformStatus,
    RegisterKernels,
    Tier,
    hookimpl,
    probe_platform,
)
from ejk_example import _rms_norm, _split_k, ops, policy

#: A FAST-tier kernel, after ejk-xla's ``dot`` (VENDOR tier) and the FAST GEMMs of higher priority:
#: split-K runs where the team policy, a ranking pack or the autotuner picks it.
SPLIT_K_PRIORITY = -5


@hookimpl
def ejk_register_kernels(register: RegisterKernels) -> None:
    register(ops.KERNEL.op_id, Platform.XLA, Backend.ANY, name="fused", cfg_type=_rms_norm.RmsNormConfig,
             config_space=_rms_norm.config_space, heuristic=_rms_norm.heuristic_config,
             capability=_rms_norm.capability,
             vjp=VJP(fwd=_rms_norm.forward_with_residuals, bwd=_rms_norm.backward,
                     residuals="example_rms_norm:x+weight+inv_rms"))(_rms_norm.forward)
    register("matmul", Platform.XLA, Backend.ANY, priority=SPLIT_K_PRIORITY, tier=Tier.FAST, name="split_k",
             cfg_type=_split_k.SplitKConfig, config_space=_split_k.config_space,
             heuristic=_split_k.heuristic_config, capability=_split_k.capability)(_split_k.matmul)


@hookimpl
def ejk_choose_config(invocation: Invocation[Any], kernel: Kernel[Any, Any]) -> Any | None:
    return policy.choose(invocation, kernel)


@hookimpl
def ejk_platform_status() -> PlatformStatus:
    return probe_platform("xla", requires={"jax": "jax"})
