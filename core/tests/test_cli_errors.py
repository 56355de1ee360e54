"""Bad command-line input ends in a clear error naming the option (exit 2), never a traceback,
and messages keep their bracketed text (issue 28)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import ejk
import ejk.plugins
import ejk.registry
from ejk import cli
from ejk.plugins import PluginHost


@pytest.mark.parametrize(("argv", "option"), [
    (["explain", "flash_attention", "--q", "1x2x3"], "--q"),
    (["explain", "flash_attention", "--q", "1x8x2x16", "--dtype", "banana"], "--dtype"),
    (["explain", "flash_attention", "--q", "1x8x2x16", "--window", "1,2,3"], "--window"),
    (["explain", "flash_attention", "--q", "1x8x2x16", "--window", "a"], "--window"),
    (["explain", "grouped_matmul", "--lhs", "8x4x2", "--rhs", "2x4x8"], "--lhs"),
    (["explain", "grouped_matmul", "--lhs", "8x4", "--rhs", "4x8"], "--rhs"),
])
def test_explain_refuses_bad_options_by_name(argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["attention:1x128x4x64:kv=0", "attention:1x128x4x64:kv=3",
                                  "decode:2x64:hkv=0", "decode:2x64:page=-4"])
def test_bench_refuses_bad_shape_options(spec: str, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    assert cli.main(["bench", "--shapes", spec, "--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "--shapes" in out and spec in out


def test_error_messages_keep_bracketed_text(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def refuses(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("q is [b, s, h, d] but needs [bold];")

    monkeypatch.setattr(ejk, "explain", refuses)
    assert cli.main(["explain", "matmul", "--a", "4x4", "--b", "4x4"]) == 2
    assert "q is [b, s, h, d] but needs [bold];" in capsys.readouterr().out


def test_doctor_and_plugins_keep_bracketed_text_of_plugins(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    class Bracketed:
        @ejk.hookimpl
        def ejk_platform_status(self) -> Any:
            return "[b, s] [red]"

    host: PluginHost = ejk.plugins.get_plugin_host()
    monkeypatch.setattr(ejk.registry, "kernel_registry", host.registry)
    with pytest.warns(RuntimeWarning):
        host.register_plugin(Bracketed(), "bracketed")
    assert cli.main(["doctor"]) == 1
    assert "returned str '[b, s] [red]'" in capsys.readouterr().out
    assert cli.main(["plugins"]) == 0
    assert "'[b, s] [red]'" in capsys.readouterr().out
    assert cli.main(["plugins", "--json"]) == 0
    assert "[b, s] [red]" in json.loads(capsys.readouterr().out)[0]["hook_errors"][0]

