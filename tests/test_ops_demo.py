"""`ejk demo`, the README's main command: tune, persist, reuse — across processes too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _demo(cache: Path, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EJK_", "EJKERNEL_"))}
    result = subprocess.run([sys.executable, "-m", "ejk.cli", "demo", "--size", "tiny", "--cache-dir", str(cache),
                             *extra], capture_output=True, text=True, env={**env, "JAX_PLATFORMS": "cpu"},
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.slow
def test_demo_tunes_persists_and_reuses(tmp_path: Path) -> None:
    first = _demo(tmp_path)
    assert "autotune" in first and "autotuning: median time of each compiled candidate" in first
    assert "persistent" in first  # run 2 of the same process reads the file
    assert "chosen: xla/any:chunked FlashAttentionConfig" in first
    assert (tmp_path / "flash_attention.json").exists()
    second = _demo(tmp_path)  # a new process: the first decision already comes from disk
    assert "tuned by an earlier run" in second and "autotuning: median" not in second
    third = _demo(tmp_path, "--fresh")
    assert "--fresh: removed the cached choice" in third and "autotuning: median" in third
