"""The ``pallas`` entry point. Pallas ships with jax; it compiles on GPU and TPU only."""

from __future__ import annotations

import ejk
from ejk.plugins import probe_platform


@ejk.hookimpl
def ejk_platform_status() -> ejk.PlatformStatus:
    return probe_platform("pallas", requires={"jax.experimental.pallas": "jax"}, backends=("gpu", "tpu"),
                          fix="Pallas needs a GPU or TPU (on the CPU it runs only in interpret mode, for tests)")
