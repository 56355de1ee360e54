"""``ejk bench`` with fake implementations of ``matmul`` (core alone: no plugin installed).

A fast and a slow implementation come out in the right order, one that raises or is refused by
its gate becomes a line (not a crash), and the command writes its JSON, markdown and PNG files.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugins
from ejk import bench, cli
from ejk.bench import _cases, _peaks, _plot, _report, _runner
from ejk.ops._linear_cross_entropy._bench import LinearCrossEntropyCase
from ejk.ops._matmul._op import MATMUL
from ejk.plugins import PlatformStatus
from ejk.registry import KernelRegistry


@attrs.frozen(kw_only=True)
class FastCfg:
    unroll: int = 1


QUICK_POLICY = ejk.AutotunePolicy(warmup=1, repeats=5, min_sample_seconds=0.002, progress=False, persist=False)


def fast(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> jax.Array:
    return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(preferred_element_type)


def slow(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> jax.Array:
    big = jnp.tile(a.astype(jnp.float32), (8, 8))  # burns ~1000x the work, then adds nothing to the result
    burn = jax.lax.fori_loop(0, 6, lambda _, m: jnp.tanh(m @ m), big)
    return (fast(a, b, precision=precision, preferred_element_type=jnp.float32) + 0.0 * jnp.sum(burn)).astype(
        preferred_element_type)


def broken(a: jax.Array, b: jax.Array, **_: Any) -> jax.Array:
    raise RuntimeError("this kernel exploded")


def refuses(a: Any, b: Any, **_: Any) -> str:
    return "needs a device this machine does not have"


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four ``matmul`` implementations in the private plugin host of conftest, behind the public op."""
    host = ejk.plugins.get_plugin_host()

    class Fakes:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("matmul", "fakeplat", "any", name="slow", priority=3)(slow)
            register("matmul", "fakeplat", "any", name="fast", priority=2, cfg_type=FastCfg,
                     config_space=lambda **_: [FastCfg(unroll=1), FastCfg(unroll=2)],
                     heuristic=lambda **_: FastCfg(unroll=2))(fast)
            register("matmul", "fakeplat", "any", name="broken", priority=1)(broken)
            register("matmul", "fakeplat", "any", name="gated", capability=refuses)(fast)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="fakeplat", available=True)

    host.register_plugin(Fakes(), "fakes", distribution="fake-dist", version="9.9")
    monkeypatch.setattr(MATMUL, "registry", host.registry)


def _by_name(group: list[bench.Measurement]) -> dict[str, bench.Measurement]:
    return {m.name: m for m in group}


def test_fast_and_slow_come_out_in_order_and_failures_are_lines(fakes: None) -> None:
    case = bench.MatmulCase(m=64, k=64, n=64)
    peak = _peaks.Peak(name="toy", match=("cpu",), tflops={"float32": 1.0}, bandwidth_gbs=1.0, source="test")
    found = bench.run([case], bench.Options(dtype="float32", modes=("fwd", "fwd+bwd"), policy=QUICK_POLICY),
                      peak=peak)
    for mode in ("fwd", "fwd+bwd"):
        group = [m for m in found if m.mode == mode]
        lines = _by_name(group)
        assert set(lines) == {"ejk fakeplat/any:slow", "ejk fakeplat/any:fast", "ejk fakeplat/any:broken",
                              "ejk fakeplat/any:gated", "ejk auto", "a @ b"}
        order = [m.name for m in group]
        assert order.index("ejk fakeplat/any:fast") < order.index("ejk fakeplat/any:slow")
        fast_line, slow_line = lines["ejk fakeplat/any:fast"], lines["ejk fakeplat/any:slow"]
        assert fast_line.rate is not None and slow_line.rate is not None and fast_line.rate > 3 * slow_line.rate
        assert slow_line.median_s is not None and fast_line.median_s is not None
        assert slow_line.median_s > fast_line.median_s
        # Failures are lines with a status and the reason, after every measured line.
        assert lines["ejk fakeplat/any:broken"].status == "failed"
        assert "this kernel exploded" in (lines["ejk fakeplat/any:broken"].error or "")
        assert lines["ejk fakeplat/any:gated"].status == "skipped"
        assert "does not have" in (lines["ejk fakeplat/any:gated"].error or "")
        assert [m.status for m in group][-2:] != ["ok", "ok"] and all(
            m.status == "ok" for m in group[: order.index("ejk fakeplat/any:slow") + 1])
        # Every measured line: compile time apart, spread, FLOPs, a ratio to the baseline, a fraction of peak.
        baseline = lines["a @ b"]
        assert baseline.ratio == pytest.approx(1.0)
        for m in (fast_line, slow_line, baseline, lines["ejk auto"]):
            assert m.status == "ok" and m.compile_s is not None and m.compile_s > 0
            assert m.iqr_s is not None and m.min_s is not None and m.max_s is not None and len(m.times) == 5
            assert m.min_s <= m.median_s <= m.max_s  # type: ignore[operator]
            assert m.work == 2 * 64**3 * (3 if mode == "fwd+bwd" else 1) and m.unit == "TFLOP/s"
            assert m.ratio == pytest.approx(m.rate / baseline.rate)  # type: ignore[operator]
            assert m.peak_fraction == pytest.approx(m.rate)  # a peak of 1 TFLOP/s
        # platform="auto" takes the highest-priority usable implementation, and says so.
        assert lines["ejk auto"].implementation == "fakeplat/any:slow"
    fwd = _by_name([m for m in found if m.mode == "fwd"])
    assert fwd["ejk fakeplat/any:fast"].max_abs_diff == pytest.approx(0.0, abs=1e-4)
    assert fwd["ejk fakeplat/any:fast"].diff_against == "a @ b"


def test_impl_and_baseline_filters_and_best_config(fakes: None) -> None:
    options = bench.Options(dtype="float32", modes=("fwd",), impls=("fakeplat/any:fast", "auto"), baselines=(),
                            best_config=True, policy=QUICK_POLICY)
    found = _by_name(bench.run([bench.MatmulCase(m=16, k=16, n=16)], options))
    assert set(found) == {"ejk fakeplat/any:fast", "ejk fakeplat/any:fast best", "ejk auto", "ejk auto tuned"}
    assert all(m.status == "ok" and m.ratio is None for m in found.values())  # no baseline: no ratio
    assert found["ejk fakeplat/any:fast"].config == "FastCfg(unroll=2)"  # the heuristic's config
    best = found["ejk fakeplat/any:fast best"]
    assert best.kind == "ejk-best" and best.config in ("FastCfg(unroll=1)", "FastCfg(unroll=2)")
    assert best.note is not None and best.note.startswith("2 candidates: 2 timed")
    # Tuning platform="auto" compares every implementation: the fast one wins, the broken one cannot.
    tuned = found["ejk auto tuned"]
    assert tuned.implementation == "fakeplat/any:fast" and "1 failed" in (tuned.note or "")


def test_cli_writes_json_markdown_and_png(fakes: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    code = cli.main(["bench", "matmul", "--shapes", "matmul:32x32x32;matmul:64x64x64", "--dtype", "float32",
                     "--mode", "fwd", "--quick", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "matmul fwd" in text and "this kernel exploded" in text
    data = json.loads((out / "bench.json").read_text())
    assert data["format"] == "ejk-bench" and data["environment"]["device_kind"] == jax.devices()[0].device_kind
    assert data["environment"]["versions"]["jax"] == jax.__version__
    assert data["environment"]["versions"]["fake-dist"] == "9.9"
    assert data["options"]["cases"] == ["32x32x32", "64x64x64"] and data["options"]["quick"] is True
    rows = data["measurements"]
    assert {r["case"] for r in rows} == {"32x32x32", "64x64x64"}
    assert {r["status"] for r in rows} == {"ok", "failed", "skipped"}
    markdown = (out / "bench.md").read_text()
    assert "| 64x64x64 | ejk fakeplat/any:fast |" in markdown and "failed: run failed" not in markdown
    if not _plot.plotting_available():
        pytest.skip("matplotlib is not installed (nox installs ejk-core[plot] for this test)")
    png = out / "matmul_fwd.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "![matmul_fwd](matmul_fwd.png)" in markdown


def test_cli_renders_an_earlier_run_from_its_json(fakes: None, tmp_path: Path) -> None:
    first = tmp_path / "gpu-run"
    assert cli.main(["bench", "--shapes", "matmul:32x32x32", "--mode", "fwd", "--quick", "--no-plot",
                     "--impl", "fakeplat/any:fast", "--out", str(first)]) == 0
    assert not list(first.glob("*.png"))
    again = tmp_path / "rendered"
    assert cli.main(["bench", "--from-json", str(first / "bench.json"), "--out", str(again)]) == 0
    rendered = (again / "bench.md").read_text().splitlines()
    assert rendered[: len(first_md := (first / "bench.md").read_text().splitlines())] == first_md  # plus the plots
    if _plot.plotting_available():
        assert (again / "matmul_fwd.png").is_file()
    (tmp_path / "other.json").write_text("{}")
    assert cli.main(["bench", "--from-json", str(tmp_path / "other.json")]) == 2


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["bench", "convolution", "--out", str(tmp_path)]) == 2
    assert "unknown op 'convolution'" in capsys.readouterr().out
    assert cli.main(["bench", "--shapes", "attention:4x4096x16", "--out", str(tmp_path)]) == 2
    assert "BxSxHxD" in capsys.readouterr().out


def test_an_op_without_implementations_is_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MATMUL, "registry", KernelRegistry())
    found = bench.run([bench.MatmulCase(m=8, k=8, n=8)],
                      bench.Options(dtype="float32", modes=("fwd",), policy=QUICK_POLICY))
    lines = _by_name(found)
    assert set(lines) == {"ejk auto", "a @ b"}
    assert lines["ejk auto"].status == "failed" and "ejk-xla" in (lines["ejk auto"].error or "")
    assert lines["a @ b"].status == "ok"


# -- shapes, work, peaks --------------------------------------------------------------------------------


def test_presets_hold_the_issue_shapes() -> None:
    attention = bench.PRESETS["attention"]
    assert bench.AttentionCase(batch=4, seq=4096, heads=16, dim=128, causal=True) in attention
    assert bench.AttentionCase(batch=4, seq=4096, heads=16, dim=128, causal=False) in attention
    assert bench.AttentionCase(batch=2, seq=8192, heads=16, dim=128, causal=True) in attention
    assert {c.dim for c in attention} == {64, 128, 192, 256} and any(c.heads == 4 * c.kv_heads for c in attention)  # type: ignore[attr-defined]
    assert bench.AttentionCase(batch=4, seq=4096, heads=16, dim=192, dv=128, causal=True) in attention  # DeepSeek
    assert bench.AttentionCase(batch=2, seq=8192, heads=16, dim=128, causal=False) in attention
    assert bench.AttentionCase(batch=4, seq=4096, heads=32, kv_heads=8, dim=128, causal=True) in attention
    assert len({c.series for c in attention if c.seq != 4096}) >= 2  # sweeps for the plots
    decode = [c for c in bench.PRESETS["decode"] if c.decode]  # type: ignore[attr-defined]
    assert {c.seqs for c in decode} >= {8, 64} and min(c.ctx for c in decode) == 1024  # type: ignore[attr-defined]
    assert max(c.ctx for c in decode) == 32768  # type: ignore[attr-defined]
    moe = bench.PRESETS["moe"]
    for skewed in (False, True):
        assert bench.MoeCase(experts=64, k=2048, n=1536, tokens=32768, skewed=skewed) in moe
    assert bench.MatmulCase(m=4096, k=4096, n=4096) in bench.PRESETS["matmul"]
    assert bench.MatmulCase(m=8192, k=8192, n=8192) in bench.PRESETS["matmul"]
    for k, n in ((4096, 14336), (14336, 4096)):  # decode-shaped to prefill-shaped MLP projections
        assert {c.m for c in bench.PRESETS["matmul"] if (c.k, c.n) == (k, n)} >= {1, 16, 1024, 16384}  # type: ignore[attr-defined]
    for skewed in (False, True):  # Mixtral-like and DeepSeek-like (top-8 of 16k tokens)
        assert bench.MoeCase(experts=8, k=4096, n=14336, tokens=16384, skewed=skewed) in moe
        assert bench.MoeCase(experts=256, k=7168, n=2048, tokens=8 * 16384, skewed=skewed) in moe
    assert set(bench.QUICK) == set(bench.PRESETS)


@pytest.mark.parametrize(("spec", "expected"), [
    ("attention:2x1024x8x64:causal,kv=2", bench.AttentionCase(batch=2, seq=1024, heads=8, kv_heads=2, dim=64,
                                                               causal=True)),
    ("flash_attention:1x128x4x32", bench.AttentionCase(batch=1, seq=128, heads=4, dim=32)),
    ("attention:1x4096x16x192:causal,dv=128", bench.AttentionCase(batch=1, seq=4096, heads=16, dim=192, dv=128,
                                                                   causal=True)),
    ("decode:8x4096", bench.PagedCase(seqs=8, ctx=4096)),
    ("decode:4x2048:q=256,hq=16,hkv=4,d=64,page=32",
     bench.PagedCase(seqs=4, ctx=2048, q_len=256, hq=16, hkv=4, dim=64, page=32)),
    ("moe:64x2048x1536x32768:skewed", bench.MoeCase(experts=64, k=2048, n=1536, tokens=32768, skewed=True)),
    ("gmm:8x64x32x256", bench.MoeCase(experts=8, k=64, n=32, tokens=256)),
    ("matmul:16x4096x14336", bench.MatmulCase(m=16, k=4096, n=14336)),
    ("mla:128x8192:sq=2,hq=128", bench.MlaCase(batch=128, ctx=8192, sq=2, hq=128)),
    ("lce:64x32x500", LinearCrossEntropyCase(tokens=64, hidden=32, vocab=500)),
    ("lce:64x32x500:zloss,smooth", LinearCrossEntropyCase(tokens=64, hidden=32, vocab=500, z_loss=True,
                                                                smoothing=True)),
])
def test_shape_specs(spec: str, expected: bench.Case) -> None:
    assert bench.parse_case(spec) == expected
    assert bench.parse_shapes([f"matmul; {spec}"]) == [*bench.PRESETS["matmul"], expected]


@pytest.mark.parametrize(("spec", "message"), [
    ("attention:4x4096x16", "BxSxHxD"), ("matmul:0x4x4", "MxKxN"), ("conv:1x2", "unknown op"),
    ("decode:8x4096:heads=3", "unknown option"), ("matmul:8x8x8:kv=x", "unknown option"), ("nonsense", "not a preset"),
    ("lce:8x8x8:zloss=2", "zloss is a flag"), ("lce:8x8x8:cap", "unknown option.*allowed: zloss, smooth"),
])
def test_bad_shape_specs_say_what_is_expected(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bench.parse_shapes([spec])


def test_work_counts() -> None:
    full = bench.workload_for(bench.AttentionCase(batch=2, seq=128, heads=4, dim=64), "bfloat16")
    causal = bench.workload_for(bench.AttentionCase(batch=2, seq=128, heads=4, dim=64, causal=True), "bfloat16")
    assert full.work("fwd") == (4 * 2 * 4 * 128 * 128 * 64, "TFLOP/s")
    assert causal.work("fwd")[0] == full.work("fwd")[0] / 2
    assert causal.work("fwd+bwd")[0] == 3.5 * causal.work("fwd")[0]
    split = bench.workload_for(bench.AttentionCase(batch=2, seq=128, heads=4, dim=96, dv=32), "bfloat16")
    assert split.work("fwd")[0] == full.work("fwd")[0] and split.out_shape() == (2, 128, 4, 32)  # 2·(96 + 32) = 4·64
    assert [x.shape[-1] for x in split.inputs()] == [96, 96, 32]
    decode = bench.workload_for(bench.PagedCase(seqs=8, ctx=1024, hkv=8, dim=128), "bfloat16")
    assert decode.work("fwd") == (2 * 8 * 1024 * 8 * 128 * 2, "GB/s") and decode.modes == ("fwd",)
    prefill = bench.workload_for(bench.PagedCase(seqs=1, ctx=4, q_len=2, hq=1, hkv=1, dim=1), "float32")
    assert prefill.work("fwd") == (4.0 * (3 + 4), "TFLOP/s")  # the two queries see 3 and 4 keys
    moe = bench.workload_for(bench.MoeCase(experts=4, k=8, n=16, tokens=100, skewed=True), "bfloat16")
    sizes = moe.group_sizes()  # type: ignore[attr-defined]
    assert sizes.sum() == 100 and len(sizes) == 4 and sizes.min() >= 0 and len(set(sizes.tolist())) > 1
    assert moe.work("fwd+bwd") == (3 * 2 * 100 * 8 * 16, "TFLOP/s")


def test_rmsnorm_residual_case_passes_residual_and_counts_its_bytes() -> None:
    case = bench.parse_case("rmsnorm:64x32:residual")
    assert case == bench.parse_case("rms_norm:64x32:residual") and case.label == "64x32 residual"  # type: ignore[attr-defined]
    assert any(c.residual for c in bench.PRESETS["rmsnorm"])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="allowed: residual"):
        bench.parse_case("rmsnorm:64x32:fused")
    plain = bench.workload_for(bench.parse_case("rmsnorm:64x32"), "bfloat16")
    fused = bench.workload_for(case, "bfloat16")
    assert plain.work("fwd+bwd") == (64 * 32 * 2 * 5.0, "GB/s") and fused.work("fwd+bwd")[0] == 64 * 32 * 2 * 8.0
    assert fused.work("fwd")[0] == 64 * 32 * 2 * 4.0 and (plain.diff, fused.diff) == ((0, 1), (0, 1, 2))
    positional, keywords = fused.split_inputs(fused.inputs())
    assert len(positional) == 2 and keywords["residual"].shape == (64, 32)
    assert [c.shape for c in fused.cotangent()] == [(64, 32), (64, 32)]  # one per output


def test_peaks_by_device_kind() -> None:
    h100 = bench.peak_for("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.compute("bfloat16") == pytest.approx(989.4)
    assert h100.bandwidth_gbs == 3350 and "H100" in h100.source
    assert bench.peak_for("NVIDIA H100 PCIe").bandwidth_gbs == 2000  # type: ignore[union-attr]
    assert bench.peak_for("NVIDIA H200").bandwidth_gbs == 4800  # type: ignore[union-attr]
    assert bench.peak_for("NVIDIA A100-SXM4-80GB").compute("bfloat16") == 312  # type: ignore[union-attr]
    assert bench.peak_for("cpu") is None and bench.peak_for("TPU v5 lite") is None


def test_out_of_memory_is_its_own_status() -> None:
    assert _runner._failure("run", RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8GiB"))[0] == "oom"
    assert _runner._failure("run", ValueError("bad"))[0] == "failed"


def test_a_failure_says_where_it_was_raised() -> None:
    def inner() -> None:
        raise RuntimeError("Could not create or locate cache dir")

    try:
        inner()
    except RuntimeError as exc:
        status, text = _runner._failure("run", exc)
    assert status == "failed"
    assert text.startswith("run failed: RuntimeError: Could not create or locate cache dir (at test_bench.py:")
    assert " inner ← test_bench.py:" in text and "test_a_failure_says_where_it_was_raised)" in text
    assert _runner._failure("run", ValueError("bad"))[1] == "run failed: ValueError: bad"  # never raised: no frames


def test_headlines_and_markdown_of_measurements() -> None:
    def line(name: str, kind: str, rate: float, ratio: float) -> bench.Measurement:
        return bench.Measurement(op="matmul", case="8x8x8", series="square", x=8, mode="fwd", name=name, kind=kind,
                                 status="ok", rate=rate, ratio=ratio, unit="TFLOP/s", median_s=1e-3, iqr_s=1e-5)

    group = [line("ejk auto", "ejk-auto", 2.0, 0.5), line("a @ b", "baseline", 4.0, 1.0),
             attrs.evolve(line("ejk x", "ejk", 0, 0), status="failed", rate=None, ratio=None, error="boom | bad")]
    assert _report.headlines(group) == ["matmul fwd: ejk auto at 0.50x the best baseline (median of 1 shapes, "
                                        "0.50–0.50x)"]
    text = _report.markdown(group, {"versions": {"jax": "1"}, "date": "d"}, {"dtype": "bfloat16"}, None)
    assert "| 8x8x8 | a @ b | 1.000 |" in text and "failed: boom \\| bad" in text and "jax 1" in text
    assert "timed by the wall clock" in text  # the report names its clock
    device = _report.markdown(group, {"date": "d"}, {"dtype": "bfloat16", "clock": "device"}, None)
    assert "timed by the GPU's own timeline" in device


def test_aliases_cover_every_preset() -> None:
    for op, preset in _cases.PRESET_OF_OP.items():
        assert _cases.resolve_op(preset) == op
        assert all(case.op == op for case in bench.PRESETS[preset])


def test_without_matplotlib_the_cli_says_how_to_get_plots(fakes: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it now raises ImportError
    assert not _plot.plotting_available()
    with pytest.raises(ImportError, match=r"pip install 'ejk-core\[plot\]'"):
        _plot.plot([], tmp_path)
    out = tmp_path / "bench"
    assert cli.main(["bench", "--shapes", "matmul:16x16x16", "--mode", "fwd", "--quick", "--impl", "auto",
                     "--out", str(out)]) == 0
    assert "ejk-core[plot]" in capsys.readouterr().out
    assert (out / "bench.json").is_file() and (out / "bench.md").is_file() and not list(out.glob("*.png"))


# -- config sweep, backward pairing ---------------------------------------------------------------------


def test_all_configs_times_every_config_of_the_space(fakes: None) -> None:
    options = bench.Options(dtype="float32", modes=("fwd",), impls=("fakeplat/any:fast",), baselines=(),
                            all_configs=True, policy=QUICK_POLICY)
    found = _by_name(bench.run([bench.MatmulCase(m=16, k=16, n=16)], options))
    assert set(found) == {"ejk fakeplat/any:fast", "ejk fakeplat/any:fast #0", "ejk fakeplat/any:fast #1"}
    sweep = [found["ejk fakeplat/any:fast #0"], found["ejk fakeplat/any:fast #1"]]
    assert [m.config for m in sweep] == ["FastCfg(unroll=1)", "FastCfg(unroll=2)"]
    assert all(m.kind == "ejk-config" and m.status == "ok" and m.rate for m in sweep)
    assert [m.note for m in sweep] == [None, "the heuristic's config"]
    assert "the heuristic's config" in _report._note(sweep[1])


def _mm_fwd(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any,
            cfg: Any = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return fast(a, b, precision=precision, preferred_element_type=preferred_element_type), (a, b)


TRACED_BACKWARDS: list[str] = []


def _mm_bwd(name: str) -> Any:
    def bwd(residuals: Any, ct: jax.Array, *, cfg: Any = None, **_: Any) -> tuple[jax.Array, jax.Array]:
        TRACED_BACKWARDS.append(name)
        a, b = residuals
        return (ct @ b.T).astype(a.dtype), (a.T @ ct).astype(b.dtype)

    return bwd


@pytest.fixture
def pairable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three ``matmul`` implementations with VJPs: two share a residual format, one saves another."""
    host = ejk.plugins.get_plugin_host()

    class Pairable:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            for name, tag in (("pa", "mm:ab"), ("pb", "mm:ab"), ("pc", "mm:other")):
                register("matmul", "fakeplat", "any", name=name,
                         vjp=ejk.VJP(fwd=_mm_fwd, bwd=_mm_bwd(name), residuals=tag))(fast)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="fakeplat", available=True)

    host.register_plugin(Pairable(), "pairable", distribution="fake-dist", version="9.9")
    monkeypatch.setattr(MATMUL, "registry", host.registry)
    TRACED_BACKWARDS.clear()


def test_backward_pairs_a_forward_with_another_implementations_backward(pairable: None) -> None:
    options = bench.Options(dtype="float32", modes=("fwd", "fwd+bwd"), impls=("fakeplat/any:pa",), baselines=(),
                            backward=("fakeplat/any:p",), policy=QUICK_POLICY)
    found = bench.run([bench.MatmulCase(m=16, k=16, n=16)], options)
    fwd = _by_name([m for m in found if m.mode == "fwd"])
    both = _by_name([m for m in found if m.mode == "fwd+bwd"])
    assert set(fwd) == {"ejk fakeplat/any:pa"}  # a pairing is a fwd+bwd line only
    # pb consumes pa's residuals; pc saves another format and pairs with nothing.
    assert set(both) == {"ejk fakeplat/any:pa", "ejk fakeplat/any:pa + bwd fakeplat/any:pb"}
    paired = both["ejk fakeplat/any:pa + bwd fakeplat/any:pb"]
    assert paired.status == "ok" and paired.rate and "backward fakeplat/any:pb" in (paired.config or "")
    assert TRACED_BACKWARDS.count("pb") == 1  # traced once, for the paired line (pb has no line of its own)


def test_backward_pairing_refused_by_the_gate_is_a_skipped_line(pairable: None, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setattr(MATMUL, "_backward_reason", lambda spec, backward, inv: "no pairing today")

    heuristic_of = MATMUL.heuristic_of

    def heuristic_of_a_refused_call(spec: Any, inv: Any) -> Any:
        if spec.name == "pb":  # as a backward's heuristic may, for a head dim its gate refuses
            raise KeyError(256)
        return heuristic_of(spec, inv)

    monkeypatch.setattr(MATMUL, "heuristic_of", heuristic_of_a_refused_call)
    options = bench.Options(dtype="float32", modes=("fwd+bwd",), impls=("fakeplat/any:pa",), baselines=(),
                            backward=("fakeplat/any:pb",), policy=QUICK_POLICY)
    paired = _by_name(bench.run([bench.MatmulCase(m=8, k=8, n=8)], options))[
        "ejk fakeplat/any:pa + bwd fakeplat/any:pb"]
    assert paired.status == "skipped" and paired.error == "no pairing today"


# -- the overhead and tuning studies --------------------------------------------------------------------


def test_overhead_study_pairs_each_implementation_with_its_bare_function(fakes: None) -> None:
    from ejk.bench._overhead import OVERHEAD_MODES, run_overhead

    options = bench.Options(dtype="float32", impls=("fakeplat/any:fast", "fakeplat/any:broken",
                                                    "fakeplat/any:gated", "auto"), policy=QUICK_POLICY)
    found = run_overhead([bench.MatmulCase(m=16, k=16, n=16)], options)
    assert [m.mode for m in found] == [mode for mode in OVERHEAD_MODES for _ in range(7)]
    for mode in OVERHEAD_MODES:
        lines = _by_name([m for m in found if m.mode == mode])
        assert set(lines) == {"bare fakeplat/any:fast", "ejk fakeplat/any:fast", "bare fakeplat/any:broken",
                              "ejk fakeplat/any:broken", "ejk fakeplat/any:gated", "bare auto", "ejk auto"}
        bare, ours = lines["bare fakeplat/any:fast"], lines["ejk fakeplat/any:fast"]
        assert bare.status == ours.status == "ok" and bare.kind == "baseline" and ours.kind == "ejk"
        assert ours.ratio == pytest.approx(bare.median_s / ours.median_s)  # type: ignore[operator]
        assert "µs per call over bare" in (ours.note or "")
        assert lines["ejk auto"].implementation == "fakeplat/any:slow" and lines["ejk auto"].status == "ok"
        assert lines["bare fakeplat/any:broken"].status == "failed"
        assert "this kernel exploded" in (lines["bare fakeplat/any:broken"].error or "")
        assert lines["ejk fakeplat/any:gated"].status == "skipped"
    jit = _by_name([m for m in found if m.mode == "jit"])
    assert "same compiled ops as bare: yes" in (jit["ejk fakeplat/any:fast"].note or "")
    assert "same compiled ops as bare: yes" in (jit["ejk auto"].note or "")


def test_profile_of_eager_calls(fakes: None) -> None:
    from ejk.bench._overhead import profile_eager

    text = profile_eager(bench.MatmulCase(m=8, k=8, n=8), bench.Options(dtype="float32", policy=QUICK_POLICY),
                         calls=20, top=5)
    assert text.startswith("# matmul 8x8x8: 20 eager calls") and "## by tottime" in text
    assert "## by cumulative" in text and "ncalls" in text


def test_tuning_study_one_line_per_worker_count(fakes: None) -> None:
    from ejk.bench._tuning_study import run_tuning

    options = bench.Options(dtype="float32", modes=("fwd",), policy=QUICK_POLICY)
    found = run_tuning([bench.MatmulCase(m=16, k=16, n=16)], options, workers=(1, 2), fresh_process=False)
    assert [m.name for m in found] == ["autotune, compile_workers=1", "autotune, compile_workers=2"]
    for m in found:
        assert m.status == "ok" and m.mode == "tuning fwd" and m.kind == "tuning"
        assert m.implementation == "fakeplat/any:fast"  # faster than the others; the broken one fails
        assert m.median_s and m.compile_s is not None and m.median_s >= m.compile_s
        assert "candidates" in (m.note or "") and "1 failed" in (m.note or "")


def test_tuning_study_request_round_trip_and_fresh_interpreter(tmp_path: Path) -> None:
    from ejk.bench import _tuning_study

    case = bench.AttentionCase(batch=1, seq=8, heads=2, kv_heads=1, dim=4, causal=True)
    options = bench.Options(dtype="float32", seed=3, tune_seconds=5.0, policy=QUICK_POLICY)
    request = json.loads(json.dumps(_tuning_study._request(case, options, "fwd+bwd", 2)))
    back, again, mode, workers = _tuning_study._from_request(request)
    assert (back, mode, workers) == (case, "fwd+bwd", 2)
    assert (again.dtype, again.seed, again.tune_seconds, again.policy.repeats) == ("float32", 3, 5.0, 5)
    # The fresh interpreter loads the installed plugins, not this test's: with none, the failure is a line.
    (line,) = _tuning_study.run_tuning([bench.MatmulCase(m=8, k=8, n=8)],
                                       attrs.evolve(options, modes=("fwd",)), workers=(1,))
    assert line.status == "ok" or "tuning interpreter exited" in (line.error or "")


def test_cli_overhead_study(fakes: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "overhead"
    assert cli.main(["bench", "--overhead", "--shapes", "matmul:16x16x16", "--impl", "fakeplat/any:fast",
                     "--dtype", "float32", "--quick", "--no-plot", "--profile", "10", "--out", str(out)]) == 0
    markdown = (out / "bench.md").read_text()
    assert "overhead study" in markdown and "## matmul jit" in markdown and "## matmul eager" in markdown
    assert "| 16x16x16 | ejk fakeplat/any:fast |" in markdown
    assert "## ejk startup" in markdown and "| import ejk + plugins |" in markdown and "over import jax" in markdown
    assert (out / "profile_matmul_0.txt").read_text().startswith("# matmul 16x16x16: 10 eager calls")
    assert json.loads((out / "bench.json").read_text())["options"]["study"] == "overhead"
    eager = (out / "eager_overhead.md").read_text()  # eager µs, jit µs and their difference, per line
    assert "| eager µs | jit µs | eager − jit µs | best eager − best jit µs |" in eager
    number, signed = r"[0-9.]+ \|", r"[+-][0-9.]+ \|"
    assert re.search(rf"\| matmul \| 16x16x16 \| ejk fakeplat/any:fast \| {number} {number} {signed} {signed}", eager)


def test_cli_sweep_and_study_arguments(fakes: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    assert cli.main(["bench", "--shapes", "matmul:16x16x16", "--impl", "fakeplat/any:fast", "--all-configs",
                     "--backward", "fakeplat", "--dtype", "float32", "--mode", "fwd", "--quick", "--out",
                     str(out)]) == 0
    assert "| 16x16x16 | ejk fakeplat/any:fast #1 |" in (out / "bench.md").read_text()
    data = json.loads((out / "bench.json").read_text())
    assert data["options"]["all_configs"] is True and data["options"]["backward"] == ["fakeplat"]
    capsys.readouterr()
    assert cli.main(["bench", "--tuning", "--workers", "0", "--out", str(tmp_path)]) == 2
    assert "--workers '0'" in capsys.readouterr().out
    assert cli.main(["bench", "--profile", "5", "--out", str(tmp_path)]) == 2
    assert "add --overhead" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["bench", "--overhead", "--tuning"])


def test_a_deprecated_jax_kernel_still_builds_its_baseline_where_warnings_are_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # jax 0.11 deprecates jax.experimental.pallas.ops.gpu.paged_attention on import: the baseline must still run
    # (the GPU test of `ejk bench` runs with warnings as errors).
    from ejk.bench._baselines import _jax_reference_kernel

    (tmp_path / "deprecated_kernel_for_ejk_test.py").write_text(
        "import warnings\nwarnings.warn('this module is deprecated', DeprecationWarning, stacklevel=2)\nVALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _jax_reference_kernel("deprecated_kernel_for_ejk_test").VALUE == 3


def test_a_zloss_case_passes_its_loss_options() -> None:
    from ejk.bench._cases import parse_shapes
    from ejk.bench._workloads import workload_for
    from ejk.ops._linear_cross_entropy._bench import LABEL_SMOOTHING, Z_LOSS

    (case,) = parse_shapes(["lce:16x8x40:zloss,smooth"])
    workload = workload_for(case, jnp.float32)
    assert case.label == "T=16 H=8 V=40 zloss smooth"
    _, static = workload.normalize(workload.inputs())
    assert (static["z_loss"], static["label_smoothing"], static["reduction"]) == (Z_LOSS, LABEL_SMOOTHING, "mean")


def test_a_sinks_case_passes_its_sinks_by_keyword() -> None:
    """The sinks of an attention case reach the op by keyword, through every path that validates the call
    (the bench runner, the overhead and tuning studies): ``flash_attention`` takes q, k, v positionally."""
    from ejk.bench._cases import parse_shapes
    from ejk.bench._workloads import workload_for

    (case,) = parse_shapes(["attention:1x32x2x16:causal,window=8,sinks"])
    workload = workload_for(case, jnp.float32)
    inputs = workload.inputs()
    positional, kwargs = workload.split_inputs(inputs)
    assert len(positional) == 3 and kwargs["sinks"] is inputs[3] and kwargs["sliding_window"] == (8, 0)
    arrays, static = workload.normalize(inputs)
    assert static["causal"] and any(a is not None and a.shape == (2,) for a in arrays)  # the sinks, among the arrays
