"""``ejk bench --write-pack``: a config pack's rankings (forward and forward+backward, per shape class)
from bench measurements, read back by the heuristics tier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugins
from ejk import cli
from ejk.bench import Measurement
from ejk.bench._packs import default_device_pattern, rankings_pack
from ejk.config.packs import load_pack
from ejk.ops._matmul._op import MATMUL
from ejk.plugins import PlatformStatus

_CALL = {"q": {"shape": [1, 128, 2, 64], "dtype": "bfloat16"}, "k": {"shape": [1, 128, 2, 64], "dtype": "bfloat16"},
         "causal": True}


def _m(case: str, name: str, seconds: float, *, mode: str = "fwd", kind: str = "ejk", d: int = 64,
       status: str = "ok") -> Measurement:
    call = {**_CALL, "q": {"shape": [1, 128, 2, d], "dtype": "bfloat16"}}
    return Measurement(op="flash_attention", case=case, series="s", x=1, mode=mode, name=name, kind=kind,
                       status=status, median_s=seconds if status == "ok" else None, call=call)


def test_rankings_by_mode_and_shape_class() -> None:
    found = [
        _m("c1", "ejk pallas/gpu:mosaic", 1.0), _m("c1", "ejk xla/gpu:cudnn", 2.0),
        _m("c2", "ejk pallas/gpu:mosaic", 1.1), _m("c2", "ejk xla/gpu:cudnn", 1.0),
        _m("c1", "jax.nn cudnn", 0.1, kind="baseline"), _m("c1", "ejk auto", 0.1, kind="ejk-auto"),
        _m("c1", "ejk triton/gpu:flash", 0.1, status="failed"),
        _m("c1", "ejk pallas/gpu:mosaic", 3.0, mode="fwd+bwd"), _m("c1", "ejk xla/gpu:cudnn", 2.0, mode="fwd+bwd"),
        _m("c1", "ejk cute/gpu:fa3 + bwd pallas/gpu:mosaic", 1.5, mode="fwd+bwd"),
        _m("c3", "ejk xla/gpu:cudnn", 1.0, d=128), _m("c3", "ejk pallas/gpu:mosaic", 2.0, d=128),
    ]
    pack = rankings_pack(found, device="gpu|NVIDIA_H100*", source="bench.json")
    by_key = {(r["mode"], r["when"]["q.shape[3]"]): r for r in pack["rankings"]["flash_attention"]}
    assert set(by_key) == {("fwd", 64), ("fwd+bwd", 64), ("fwd", 128)}
    assert by_key["fwd", 64]["order"] == ["pallas/gpu:mosaic", "xla/gpu:cudnn"]  # geomean 1.05 vs 1.41
    assert by_key["fwd", 64]["when"] == {"q.dtype": "bfloat16", "q.shape[3]": 64, "causal": True}
    assert by_key["fwd+bwd", 64]["order"] == ["cute/gpu:fa3+pallas/gpu:mosaic", "xla/gpu:cudnn", "pallas/gpu:mosaic"]
    assert by_key["fwd", 128]["order"] == ["xla/gpu:cudnn", "pallas/gpu:mosaic"]
    assert "2 case(s): c1, c2" in by_key["fwd", 64]["source"]


def test_the_written_pack_loads(tmp_path: Path) -> None:
    path = tmp_path / "pack.json"
    path.write_text(json.dumps(rankings_pack([_m("c1", "ejk pallas/gpu:mosaic", 1.0)], device="*", source="x")))
    (ranking,) = load_pack(str(path)).rankings["flash_attention"]
    assert ranking.mode == "fwd" and ranking.order == ("pallas/gpu:mosaic",)


def test_device_pattern_of_a_run() -> None:
    assert default_device_pattern({"backend": "gpu", "device_kind": "NVIDIA H100 80GB HBM3"}) == \
        "gpu|NVIDIA_H100_80GB_HBM3*"


def test_cli_writes_a_pack_from_a_run(fakes: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, pack = tmp_path / "run", tmp_path / "pack.json"
    assert cli.main(["bench", "--shapes", "matmul:16x16x16", "--mode", "fwd", "--quick", "--no-plot", "--quiet",
                     "--impl", "fakeplat/any:fast", "--impl", "fakeplat/any:slow", "--baseline", "none",
                     "--out", str(out)]) == 0
    assert cli.main(["bench", "--from-json", str(out / "bench.json"), "--out", str(out), "--no-plot",
                     "--write-pack", str(pack), "--pack-device", "cpu*"]) == 0
    assert "wrote 1 ranking(s) to the config pack" in capsys.readouterr().out
    (ranking,) = load_pack(str(pack)).rankings["matmul"]
    assert ranking.device == "cpu*" and ranking.order == ("fakeplat/any:fast", "fakeplat/any:slow")
    assert [str(c) for c in ranking.when] == ["a.dtype=bfloat16"]


def _fast(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
    return jnp.matmul(a, b).astype(preferred_element_type)


def _slow(a: jax.Array, b: jax.Array, *, precision: Any, preferred_element_type: Any, cfg: Any = None) -> Any:
    burn = jax.lax.fori_loop(0, 4, lambda _, m: jnp.tanh(m @ m), jnp.tile(a.astype(jnp.float32), (8, 8)))
    return (jnp.matmul(a, b) + 0.0 * jnp.sum(burn)).astype(preferred_element_type)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    host = ejk.plugins.get_plugin_host()  # the private, empty host of conftest

    class Fakes:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("matmul", "fakeplat", "any", name="slow", priority=3)(_slow)
            register("matmul", "fakeplat", "any", name="fast", priority=2)(_fast)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="fakeplat", available=True)

    host.register_plugin(Fakes(), "fakes")
    monkeypatch.setattr(MATMUL, "registry", host.registry)
