"""``ejk bench`` lines timed outside JAX (``Prepared.external``, as the torch SDPA baselines are): timed by
the wall clock without compiling, their output checked against the others', released after timing."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugins
from ejk import bench
from ejk.bench import _baselines
from ejk.bench._baselines import Baseline, Prepared
from ejk.ops._matmul._op import MATMUL
from ejk.plugins import PlatformStatus

QUICK = ejk.AutotunePolicy(warmup=1, repeats=3, min_sample_seconds=0.001, progress=False, persist=False)


class Handle:
    """What an external line returns: launched work, synchronised by ``block_until_ready``."""

    def __init__(self, a: Any, b: Any, events: list[str]) -> None:
        self.a, self.b, self.events, self.out = a, b, events, None

    def __call__(self) -> Handle:
        self.out = jnp.matmul(self.a, self.b)  # stands for work launched on another framework's stream
        return self

    def block_until_ready(self) -> Handle:
        jax.block_until_ready(self.out)
        return self

    def to_jax(self) -> Any:
        return self.out + 1.0  # off by one: the report's output check must see it

    def close(self) -> None:
        self.events.append("closed")


@pytest.fixture
def external(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    host = ejk.plugins.get_plugin_host()

    class Dot:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("matmul", "fakeplat", "any", name="dot")(
                lambda a, b, *, precision, preferred_element_type, cfg=None: (a @ b).astype(preferred_element_type))

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="fakeplat", available=True)

    host.register_plugin(Dot(), "dot")
    monkeypatch.setattr(MATMUL, "registry", host.registry)
    events: list[str] = []

    def build(workload: Any, inputs: tuple[Any, ...]) -> Prepared:
        def make(mode: str, cotangent: Any) -> Handle:
            events.append(f"built {mode}")
            return Handle(*inputs, events)

        return Prepared(fn=lambda *_: None, args=inputs, external=make)

    monkeypatch.setattr(_baselines, "BASELINES", [Baseline(name="other framework", op="matmul", build=build)])
    return events


def test_an_external_line_is_timed_checked_and_released(external: list[str]) -> None:
    found = bench.run([bench.MatmulCase(m=8, k=8, n=8)],
                      bench.Options(dtype="float32", modes=("fwd", "fwd+bwd"), policy=QUICK))
    lines = {(m.mode, m.name): m for m in found}
    for mode in ("fwd", "fwd+bwd"):
        line = lines[mode, "other framework"]
        assert line.status == "ok" and line.compile_s is not None and line.rate and line.rate > 0
        assert lines[mode, "ejk fakeplat/any:dot"].ratio is not None  # compared against the external line
    assert lines["fwd", "ejk fakeplat/any:dot"].max_abs_diff == pytest.approx(1.0)
    assert lines["fwd", "ejk fakeplat/any:dot"].diff_against == "other framework"
    assert external == ["built fwd", "closed", "built fwd+bwd", "closed"]


def test_torch_baselines_say_why_they_cannot_run_here() -> None:
    names = [b.name for b in _baselines.baselines_for("flash_attention")]
    assert {"torch sdpa cudnn", "torch sdpa flash"} <= set(names)
    found = bench.run([bench.AttentionCase(batch=1, seq=16, heads=2, dim=8)],
                      bench.Options(dtype="float32", modes=("fwd",), impls=("none",),
                                    baselines=("torch",), policy=QUICK))
    assert {m.name for m in found} == {"torch sdpa cudnn", "torch sdpa flash"}
    assert all(m.status == "skipped" and "NVIDIA GPU" in (m.error or "") for m in found)
