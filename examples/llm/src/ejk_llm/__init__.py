"""A Qwen3 / gpt-oss style decoder on ejk's kernels: training, paged generation, a plain-JAX switch."""

from ejk_llm.backends import Backend
from ejk_llm.config import PRESETS, ModelConfig, RunConfig, get_preset

__all__ = ["PRESETS", "Backend", "ModelConfig", "RunConfig", "get_preset"]
