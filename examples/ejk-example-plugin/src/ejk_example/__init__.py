"""ejk-example-plugin: a third-party ejk plugin in the ejk repository, as a template to copy.

It adds the ``rms_norm`` algorithm (a fused XLA kernel with its config, config space, heuristic,
capability gate and custom VJP) with a public op, a split-K implementation of ejk's ``matmul``,
and a team policy through ``ejk_choose_config``. See docs/PLUGIN_AUTHORS.md in the ejk repository.
"""

from __future__ import annotations

from ejk_example._rms_norm import RmsNormConfig
from ejk_example._split_k import SplitKConfig
from ejk_example.ops import rms_norm
from ejk_example.reference import reference_rms_norm

__all__ = ["RmsNormConfig", "SplitKConfig", "reference_rms_norm", "rms_norm"]
