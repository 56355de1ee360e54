"""The `ejk` command line (core commands; the demo is tested with the plugins in tests/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from ejk import cli
from ejk.config.persistent import PersistentCache


@attrs.frozen
class Blocks:
    block: int


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("EJK_CACHE_DIR", str(directory))
    return directory


def _fill(directory: Path) -> None:
    cache = PersistentCache("toy_op", cfg_type=Blocks)
    cache.put("cpu|cpu", "toy_op@1", "key-a", Blocks(64))
    cache.put("cpu|cpu", "toy_op@1", "key-b", Blocks(128))
    PersistentCache("other_op").put("cpu|cpu", "other_op@1", "key-c", {"tile": 8})


def test_plugins_and_kernels_json_are_consistent(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plugins", "--json"]) == 0
    plugins = json.loads(capsys.readouterr().out)
    assert cli.main(["kernels", "--json"]) == 0
    kernels = json.loads(capsys.readouterr().out)
    loaded = {p["name"] for p in plugins if p["status"] == "loaded"}
    for row in kernels:
        assert row["plugin"].split(" ")[0] in loaded
        assert {"algorithm", "platform", "backend", "tier", "priority", "plugin", "available"} <= set(row)
    for plugin in plugins:
        for status in plugin["platforms"]:
            assert status["available"] or status["reason"]


def test_plugins_table_renders(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "ejk plugins" in out or "No ejk plugin is installed" in out


def test_cache_ls_show_clear(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(cache_dir)
    assert cli.main(["cache", "ls", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {name: item["entries"] for name, item in listing.items()} == {"toy_op": 2, "other_op": 1}

    assert cli.main(["cache", "show", "--json", "--op", "toy_op"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["call_key"] for r in rows) == ["key-a", "key-b"]
    assert all(r["source"] == "autotune" and r["stale"] is None and "jax" in r["versions"] for r in rows)

    assert cli.main(["cache", "clear", "--yes", "--op", "toy_op"]) == 0
    capsys.readouterr()
    assert list(PersistentCache("toy_op").entries()) == []
    assert len(list(PersistentCache("other_op").entries())) == 1


def test_cache_export_import_round_trip(cache_dir: Path, tmp_path: Path) -> None:
    _fill(cache_dir)
    exported = tmp_path / "export.json"
    assert cli.main(["cache", "export", str(exported)]) == 0
    target = tmp_path / "elsewhere"
    PersistentCache("toy_op", str(target / "toy_op.json")).put("gpu|H100", "toy_op@1", "key-z", {"block": 32})
    assert cli.main(["cache", "import", "--dir", str(target), str(exported)]) == 0
    merged = PersistentCache("toy_op", str(target / "toy_op.json"), cfg_type=Blocks)
    assert merged.get("cpu|cpu", "toy_op@1", "key-a") == Blocks(64)
    assert merged.get("gpu|H100", "toy_op@1", "key-z") == Blocks(32)  # what was there is kept
    assert PersistentCache("other_op", str(target / "other_op.json")).get("cpu|cpu", "other_op@1", "key-c") == {
        "tile": 8
    }


def test_cache_import_rejects_foreign_file(cache_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.json"
    bogus.write_text(json.dumps({"hello": 1}))
    assert cli.main(["cache", "import", str(bogus)]) == 2
    assert "not an `ejk cache export` file" in capsys.readouterr().out


def test_doctor_reports(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "jax" in out and "device fingerprint" in out and str(cache_dir) in out
    assert status in (0, 1)
    assert (status == 0) == ("all good" in out)


def test_console_script_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "ejk.cli", "kernels", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)


def test_bad_subcommand_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["nonsense"])
    assert excinfo.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
