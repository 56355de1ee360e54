"""``ejk bench --quick`` end to end with every plugin installed: tiny shapes of the built-in ops, on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Built-in ops ejk bench measures forward only (inference ops); every other one also forward+backward.
FORWARD_ONLY = {"ragged_paged_attention", "mla_paged_attention"}


def _expected_lines() -> set[tuple[str, str]]:
    from ejk.ops import BUILTIN_OPS

    return {(op, mode) for op in BUILTIN_OPS for mode in (("fwd",) if op in FORWARD_ONLY else ("fwd", "fwd+bwd"))}


def test_bench_quick_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    env.update(JAX_PLATFORMS="cpu", EJK_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "ejk.cli", "bench", "--quick", "--reps", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())
    rows = data["measurements"]
    expected = _expected_lines()
    assert {(r["op"], r["mode"]) for r in rows} == expected
    by_line = {(r["op"], r["case"], r["mode"], r["name"]): r for r in rows}
    # Every portable implementation, ejk's automatic choice and the CPU baselines ran on every case (composed runs
    # gated grouped matmuls only: the quick cases are plain).
    for (op, _, _, name), row in by_line.items():
        if (name.startswith("ejk xla/any") and name != "ejk xla/any:composed") or name == "ejk auto" or name in (
                "jax.nn xla", "dense gather + jax.nn xla", "dense gather + einsum xla", "lax.ragged_dot", "a @ b",
                "x @ w + jnp log-softmax", "XLA-fused expression", "ejk flash_attention segment ids"):
            assert row["status"] == "ok", row
            assert row["rate"] > 0 and row["compile_s"] > 0 and len(row["times"]) == 2
            assert row["unit"] == ("GB/s" if op.endswith("paged_attention") or op == "rms_norm" else "TFLOP/s")
        if row["kind"] == "baseline" and row["status"] == "ok" and row["comparable"]:
            assert row["ratio"] is not None
        if name in ("jax.nn cudnn", "jax pallas mha", "jax pallas paged"):  # GPU baselines: a line saying why
            assert row["status"] == "skipped" and "GPU" in row["error"]
    # Forward outputs agree with the baseline's (bf16 inputs).
    diffs = [r["max_abs_diff"] for r in rows if r["mode"] == "fwd" and r["max_abs_diff"] is not None]
    assert diffs and max(diffs) < 0.1
    assert data["environment"]["versions"]["ejk-xla"] and data["options"]["quick"] is True
    markdown = (out / "bench.md").read_text()
    assert "## flash_attention fwd+bwd" in markdown and "ejk auto" in markdown
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (nox installs ejk-core[plot] for this test)")
    pngs = {f"{op}_{mode.replace('+', '_')}.png" for op, mode in expected}
    assert {p.name for p in out.glob("*.png")} == pngs
    assert all((out / name).stat().st_size > 10_000 for name in pngs)
