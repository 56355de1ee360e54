"""``bench.py``: both backends in one run (a table, the loss-curve difference, JSON), or the parts asked for."""

from __future__ import annotations

import json
import pathlib

import pytest

from ejk_llm import bench


def test_bench_compares_both_backends_and_writes_json(tmp_path: pathlib.Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    bench.main(["--preset", "tiny", "--warmup", "1", "--steps", "2", "--tokens", "3", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "train tokens/s" in printed and "generate tokens/s" in printed and "ejk / plain" in printed
    found = json.loads(out.read_text())
    assert set(found["train"]) == {"ejk", "plain", "max_loss_difference"}
    assert len(found["train"]["ejk"]["losses"]) == 3 and found["train"]["max_loss_difference"] < 1e-4  # float32
    assert found["generate"]["same_tokens"] is True  # float32: greedy tokens agree
    assert all(len(t) == 3 for t in found["generate"]["ejk"]["tokens"])


def test_bench_runs_only_the_parts_asked_for(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    bench.main(["--preset", "tiny", "--warmup", "1", "--steps", "1", "--backends", "ejk", "--skip-generation",
                "--out", str(out)])
    found = json.loads(out.read_text())
    assert set(found["train"]) == {"ejk"} and found["generate"] == {}
    assert "ejk / plain" not in capsys.readouterr().out  # nothing to compare
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--backends", "torch"])
