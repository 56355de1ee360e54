"""Model and run configurations, and the named presets."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

__all__ = ["PRESETS", "ModelConfig", "Preset", "RunConfig", "get_preset"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Qwen3 / gpt-oss style decoder.

    ``sliding_window`` is the number of keys a query sees (itself included) on the sliding layers;
    every ``full_attention_every``-th layer (the last of each group) attends to the whole sequence.
    ``n_experts == 0`` is a dense SwiGLU MLP of width ``d_ff``; otherwise each layer routes every
    token to ``top_k`` of ``n_experts`` SwiGLU experts of width ``d_ff``.
    """

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    n_experts: int = 0
    top_k: int = 2
    sliding_window: int | None = None
    full_attention_every: int = 2
    sinks: bool = False
    qk_norm: bool = True
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    dtype: str = "bfloat16"  # compute dtype; parameters and optimizer state are float32
    remat: bool = False  # recompute each layer's activations in the backward pass

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if self.n_experts and not 0 < self.top_k <= self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must lie in [1, n_experts={self.n_experts}]")

    @property
    def compute_dtype(self) -> Any:
        return jnp.dtype(self.dtype)

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    def window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (keys seen, itself included), ``None`` for full attention."""
        if self.sliding_window is None or (layer + 1) % self.full_attention_every == 0:
            return None
        return self.sliding_window

    def param_count(self) -> tuple[int, int]:
        """(total, active per token) parameter counts."""
        attn = self.d_model * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        expert = 3 * self.d_model * self.d_ff
        mlp_total = expert * max(self.n_experts, 1) + self.d_model * self.n_experts
        mlp_active = expert * (self.top_k if self.moe else 1) + self.d_model * self.n_experts
        embed = 2 * self.vocab * self.d_model
        return embed + self.n_layers * (attn + mlp_total), embed + self.n_layers * (attn + mlp_active)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Training data shape and optimisation: ``batch`` rows of ``seq_len`` packed tokens per step."""

    batch: int
    seq_len: int
    min_doc: int
    max_doc: int
    lr: float = 3e-3
    warmup: int = 5
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Generation: requests, their prompt lengths and the prefill chunk.
    prompt_lens: tuple[int, ...] = (5, 12, 3, 9)
    prefill_chunk: int = 8
    page_size: int = 8

    @property
    def max_docs(self) -> int:
        """Sequences per row, an upper bound (static: the offsets' length)."""
        return -(-self.seq_len // self.min_doc) + 1


@dataclasses.dataclass(frozen=True)
class Preset:
    model: ModelConfig
    run: RunConfig


_TINY = ModelConfig(vocab=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                    sliding_window=16, sinks=True, dtype="float32")
_TINY_RUN = RunConfig(batch=4, seq_len=64, min_doc=8, max_doc=48, lr=1e-2)

PRESETS: dict[str, Preset] = {
    # CPU, seconds: CI and the tests.
    "tiny": Preset(_TINY, _TINY_RUN),
    "tiny-moe": Preset(dataclasses.replace(_TINY, n_experts=4, top_k=2, d_ff=64), _TINY_RUN),
    # One H100 (bf16): ~1.0B parameters, 8k packed context, gpt-oss style alternating sliding layers with sinks.
    "dense-1b": Preset(
        ModelConfig(vocab=32_768, d_model=2048, n_layers=18, n_heads=16, n_kv_heads=4, head_dim=128, d_ff=6144,
                    sliding_window=1024, sinks=True, rope_theta=500_000.0, remat=True),
        RunConfig(batch=2, seq_len=8192, min_doc=256, max_doc=8192, lr=3e-4, warmup=10,
                  prompt_lens=(512, 1900, 77, 1024, 300, 2048, 5, 640), prefill_chunk=512, page_size=64),
    ),
    # One H100 (bf16): ~2.1B parameters in total, ~0.5B active (16 experts, top 2).
    "moe-2b": Preset(
        ModelConfig(vocab=32_768, d_model=2048, n_layers=12, n_heads=16, n_kv_heads=4, head_dim=128, d_ff=1536,
                    n_experts=16, top_k=2, sliding_window=1024, sinks=True, rope_theta=500_000.0, remat=True),
        RunConfig(batch=2, seq_len=8192, min_doc=256, max_doc=8192, lr=3e-4, warmup=10,
                  prompt_lens=(512, 1900, 77, 1024, 300, 2048, 5, 640), prefill_chunk=512, page_size=64),
    ),
}


def get_preset(name: str, **overrides: Any) -> Preset:
    """A preset by name, with model (``dtype=...``) or run (``batch=...``) fields replaced."""
    if name not in PRESETS:
        raise ValueError(f"preset {name!r} is unknown; choose one of {sorted(PRESETS)}")
    preset = PRESETS[name]
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = set(overrides) - model_fields - run_fields
    if unknown:
        raise ValueError(f"unknown overrides {sorted(unknown)}")
    model = dataclasses.replace(preset.model, **{k: v for k, v in overrides.items() if k in model_fields})
    run = dataclasses.replace(preset.run, **{k: v for k, v in overrides.items() if k in run_fields})
    return Preset(model, run)
