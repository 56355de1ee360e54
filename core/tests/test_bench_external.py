"""``ejk bench`` lines timed outside JAX (``Prepared.external``, as the torch SDPA baselines are): timed by
the wall clock without compiling, their output checked against the others', released after timing."""

from __future__ import annotations

import os
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


def test_fla_baselines_say_why_they_cannot_run_here() -> None:
    """fla's chunked kernels stand beside the recurrent ops (``gated_delta_rule``, ``gla``, and ``ssd`` through
    simple GLA); without an NVIDIA GPU they are skipped with the reason."""
    for op, name in (("gated_delta_rule", "fla chunk_gated_delta_rule"), ("gla", "fla chunk_gla"),
                     ("ssd", "fla chunk_simple_gla")):
        assert name in [b.name for b in _baselines.baselines_for(op)]
    found = bench.run(bench.parse_shapes(["gdr:1x32:h=2,k=16,v=16", "gla:64x32x2x16", "ssd:64x32x2x16:n=16"]),
                      bench.Options(dtype="float32", modes=("fwd",), impls=("none",), baselines=("fla",),
                                    policy=QUICK))
    assert {m.name for m in found} == {"fla chunk_gated_delta_rule", "fla chunk_gla", "fla chunk_simple_gla"}
    assert all(m.status == "skipped" and "NVIDIA GPU" in (m.error or "") for m in found)


def test_the_ssd_maps_onto_simple_gla_exactly() -> None:
    """The fla line's mapping of ``ssd`` (``q = C``, ``k = B``, ``v = dt·x``, ``g = dt·A``, scale 1, plus ``D·x``)
    is the SSD: a step-by-step simple GLA on the mapped tensors gives ``ejk.ssd``'s output."""
    from ejk.bench._fla import _ssd_as_simple_gla
    from ejk.bench._workloads import workload_for

    workload = workload_for(bench.parse_case("ssd:16x16x4x8:n=4,g=2"), jnp.float32)
    inputs = workload.inputs()
    (q, k, v, g), skip = _ssd_as_simple_gla(inputs, workload.kwargs())

    def step(state: jax.Array, t: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        q_t, k_t, v_t, g_t = t  # [H, N], [H, N], [H, P], [H]
        state = state * jnp.exp(g_t)[:, None, None] + k_t[:, :, None] * v_t[:, None, :]
        return state, jnp.einsum("hn,hnp->hp", q_t, state)

    heads, n, p = q.shape[2], q.shape[3], v.shape[3]
    _, out = jax.lax.scan(step, jnp.zeros((heads, n, p)), tuple(x[0] for x in (q, k, v, g)))
    from ejk.testing import reference_ssd

    options = workload.kwargs()
    want = reference_ssd(*inputs, options["D"], options["dt_bias"], None, options["cu_seqlens"],
                         dt_softplus=options["dt_softplus"])[0]
    assert jnp.allclose(out[None] + skip, want, atol=1e-4, rtol=1e-4)


class _FakeTorch:
    """What :func:`torch_call` uses of torch in the forward mode (no torch here)."""

    class no_grad:  # noqa: N801 (torch's name)
        def __enter__(self) -> None:
            return None

        def __exit__(self, *_: Any) -> None:
            return None


def test_a_call_needing_tritons_disk_cache_gets_a_directory_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """jax-triton empties TRITON_CACHE_DIR at import; fla's autotuner then fails unless its calls get one."""
    from ejk.bench._torch import torch_call

    seen: list[str | None] = []

    def forward() -> str:
        seen.append(os.environ.get("TRITON_CACHE_DIR"))
        return "out"

    monkeypatch.setenv("TRITON_CACHE_DIR", "")
    call = torch_call(_FakeTorch(), (), "fwd", None, forward, lambda out: out, triton_disk_cache=True)
    assert call().last == "out"
    assert seen[-1] and os.path.isabs(seen[-1]) and os.environ["TRITON_CACHE_DIR"] == ""
    torch_call(_FakeTorch(), (), "fwd", None, forward, lambda out: out)()
    assert seen[-1] == ""  # a line that does not ask keeps jax-triton's setting
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/chosen")
    torch_call(_FakeTorch(), (), "fwd", None, forward, lambda out: out, triton_disk_cache=True)()
    assert seen[-1] == "/somewhere/chosen"  # a directory the user set is used as it is
