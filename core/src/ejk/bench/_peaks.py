"""Peak throughput of known devices, for "fraction of peak" (unknown devices: no fraction).

Dense (no structured sparsity) tensor-core peaks from NVIDIA's datasheets. ``float32`` means
TF32 tensor cores: matmul-like ops run at ``precision="default"``, which uses them.
"""

from __future__ import annotations

import attrs

__all__ = ["PEAKS", "Peak", "peak_for"]


@attrs.frozen(kw_only=True)
class Peak:
    """A device's peaks.

    Attributes:
        name: The device, e.g. ``"H100 SXM5 80GB"``.
        match: Substrings all found in JAX's ``device_kind`` (case-insensitive) select it.
        tflops: Dense peak TFLOP/s per input dtype name.
        bandwidth_gbs: Memory bandwidth in GB/s.
        source: Where the numbers come from.
    """

    name: str
    match: tuple[str, ...]
    tflops: dict[str, float]
    bandwidth_gbs: float
    source: str

    def compute(self, dtype: str) -> float | None:
        return self.tflops.get(dtype)


def _datasheet(name: str, match: tuple[str, ...], bf16: float, tf32: float, bandwidth: float, sheet: str) -> Peak:
    return Peak(name=name, match=match, tflops={"bfloat16": bf16, "float16": bf16, "float32": tf32},
                bandwidth_gbs=bandwidth, source=f"NVIDIA {sheet} datasheet (dense, without sparsity)")


#: Most specific first: the first entry whose substrings all occur in the device kind wins.
PEAKS: tuple[Peak, ...] = (
    _datasheet("H200 NVL", ("h200", "nvl"), 835.5, 417.5, 4800.0, "H200"),
    _datasheet("H200 SXM 141GB", ("h200",), 989.4, 494.7, 4800.0, "H200"),
    _datasheet("H100 NVL", ("h100", "nvl"), 835.5, 417.5, 3900.0, "H100"),
    _datasheet("H100 PCIe", ("h100", "pcie"), 756.5, 378.0, 2000.0, "H100"),
    _datasheet("H100 SXM5 80GB", ("h100",), 989.4, 494.7, 3350.0, "H100"),  # device kind "NVIDIA H100 80GB HBM3"
    _datasheet("A100 80GB PCIe", ("a100", "80gb", "pcie"), 312.0, 156.0, 1935.0, "A100"),
    _datasheet("A100 SXM4 80GB", ("a100", "80gb"), 312.0, 156.0, 2039.0, "A100"),
    _datasheet("A100 40GB", ("a100",), 312.0, 156.0, 1555.0, "A100"),
)


def peak_for(device_kind: str) -> Peak | None:
    """The peaks of a device kind (``jax.devices()[0].device_kind``), ``None`` when unknown."""
    kind = device_kind.lower()
    for peak in PEAKS:
        if all(part in kind for part in peak.match):
            return peak
    return None
