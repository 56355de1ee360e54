"""The example plugin, installed next to ejk-core: conformance, the public ways to call it, the policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk_example
from ejk.testing import check_matmul, check_op, check_plugin, reference_matmul
from ejk_example import RmsNormConfig, SplitKConfig, reference_rms_norm

SPLIT_K = ejk.ImplChoice(platform="xla", backend="any", implementation="split_k")


def _executor(tmp_path: Path, events: list[Any]) -> ejk.Executor[Any, Any]:
    return ejk.Executor(ejk.ConfigSelectorChain(on_event=events.append, persistent_dir=tmp_path / "cache"))


def test_the_plugin_passes_the_conformance_checks_of_ejk_testing() -> None:
    info, registry = check_plugin("example")
    assert info.distribution == "ejk-example-plugin" and info.status == "loaded"
    labels = {(spec.algorithm, spec.label) for spec in registry}
    assert labels == {("example_rms_norm", "xla/any:fused"), ("matmul", "xla/any:split_k")}


def test_rms_norm_matches_its_reference_values_and_gradients() -> None:
    assert check_op("example_rms_norm", "xla") == 14
    # block by block: 300 rows are two blocks of 256 (the second one padded)
    assert check_op("example_rms_norm", "xla", cfg=RmsNormConfig(block_rows=256), cases=[((300, 8), 1e-6)]) == 2


def test_split_k_matches_the_matmul_reference() -> None:
    shapes = [(sa, sb) for sa, sb in ejk.testing.MATMUL_SHAPES if len(sa) >= 2 and len(sb) >= 2]
    choice = ejk.ImplChoice(platform="xla", backend="any", implementation="split_k", cfg=SplitKConfig(splits=4))
    assert check_matmul("xla", cfg=choice, shapes=shapes, dtypes=(jnp.float32,)) == len(shapes)
    assert check_matmul("xla", cfg=choice, shapes=shapes[:1], dtypes=(jnp.bfloat16,)) == 1
    assert check_matmul("xla", cfg=SPLIT_K, shapes=[((3, 40), (40, 2))], preferred_element_type=jnp.float32,
                        dtypes=(jnp.bfloat16,)) == 1


def test_the_public_ways_to_call_rms_norm_agree() -> None:
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 16)), jnp.float32)
    w = jnp.linspace(0.5, 1.5, 16, dtype=jnp.float32)
    want = reference_rms_norm(x, w, eps=1e-5)
    assert ejk.example_rms_norm is ejk_example.rms_norm
    for got in (ejk_example.rms_norm(x, w, eps=1e-5), ejk.run("example_rms_norm", x, w, eps=1e-5),
                jax.jit(lambda x, w: ejk.run("example_rms_norm", x, w, eps=1e-5))(x, w),
                ejk.example_rms_norm(x, w, eps=1e-5, cfg=RmsNormConfig(block_rows=256))):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    found = ejk.explain("example_rms_norm", jax.ShapeDtypeStruct((3, 16), jnp.bfloat16), w)
    assert found.chosen is not None and found.chosen.implementation == "fused"


def test_rms_norm_validates_its_arguments_and_gate() -> None:
    x = jnp.ones((2, 8))
    with pytest.raises(ValueError, match=r"weight has shape \(4,\).*needs shape \(8,\)"):
        ejk_example.rms_norm(x, jnp.ones(4))
    with pytest.raises(ValueError, match=r"eps is -1\.0 but needs a positive float"):
        ejk.run("example_rms_norm", x, jnp.ones(8), eps=-1.0)
    with pytest.raises(ValueError, match=r"x has shape .* floating dtype"):
        ejk_example.rms_norm(jnp.ones((2, 8), jnp.int32), jnp.ones(8))
    wide = jax.ShapeDtypeStruct((1, 70_000), jnp.float32)
    with pytest.raises(ValueError, match="hidden size 70000 > 65536 is not supported"):
        ejk.explain("example_rms_norm", wide, jax.ShapeDtypeStruct((70_000,), jnp.float32))


def test_the_team_policy_picks_split_k_for_skinny_matmuls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJKERNEL_OPS_RECORD", "1")
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((4, 512)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((512, 4)), jnp.float32)
    events: list[Any] = []
    with ejk.use_executor(_executor(tmp_path, events)):
        out = ejk.matmul(a, b)
    np.testing.assert_allclose(out, reference_matmul(a, b), rtol=1e-5, atol=1e-4)
    (event,) = events
    assert (event.tier, event.implementation) == ("plugin", "xla/any:split_k")
    assert event.cfg.cfg == SplitKConfig(splits=16)
    ran = ejk.get_implementations(jax.devices()[0])  # which implementation ran, per recorded call
    assert "xla/any:split_k" in ran["matmul@2"].values()

    events.clear()
    with ejk.use_executor(_executor(tmp_path, events)):
        ejk.matmul(a[:, :64], b[:64])  # not skinny: the normal chain decides
    assert events[0].tier == "heuristic"


def test_an_explicit_cfg_wins_over_the_policy(tmp_path: Path) -> None:
    a, b = jnp.ones((4, 512)), jnp.ones((512, 4))
    events: list[Any] = []
    with ejk.use_executor(_executor(tmp_path, events)):
        out = ejk.matmul(a, b, cfg=SplitKConfig(splits=2))
    np.testing.assert_allclose(out, jnp.full((4, 4), 512.0))
    (event,) = events
    assert (event.tier, event.implementation, event.cfg.cfg) == ("override", "xla/any:split_k", SplitKConfig(splits=2))


def test_the_policy_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_EXAMPLE_POLICY", "0")
    events: list[Any] = []
    with ejk.use_executor(_executor(tmp_path, events)):
        ejk.matmul(jnp.ones((4, 512)), jnp.ones((512, 4)))
    assert events[0].tier == "heuristic"


def test_ejk_kernels_and_plugins_list_the_implementations() -> None:
    run = [sys.executable, "-m", "ejk"]
    kernels = json.loads(subprocess.run([*run, "kernels", "--json"], capture_output=True, text=True,
                                        check=True).stdout)
    ours = {(r["algorithm"], r["name"]) for r in kernels if r["plugin"].startswith("example ")}
    assert ours == {("example_rms_norm", "fused"), ("matmul", "split_k")}
    plugins = json.loads(subprocess.run([*run, "plugins", "--json"], capture_output=True, text=True,
                                        check=True).stdout)
    (row,) = [p for p in plugins if p["name"] == "example"]
    assert row["distribution"] == "ejk-example-plugin" and row["version"] == "0.1.0"
    assert {i["implementation"]: i["status"] for i in row["implementations"]} == {
        "xla/any:fused": "available", "xla/any:split_k": "available"}


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **env})


def test_a_fresh_process_finds_the_op_on_ejk_and_traces_the_hooks() -> None:
    code = ("import ejk, jax.numpy as jnp; f = ejk.example_rms_norm; print(f.__module__); "
            "ejk.matmul(jnp.ones((2, 512)), jnp.ones((512, 2)))")
    result = _python(code, EJK_TRACE_HOOKS="1")
    assert result.stdout.strip() == "ejk_example.ops"  # asking ejk for the op loaded the plugins
    trace = [line for line in result.stderr.splitlines() if line.startswith("ejk hook: ")]
    assert any(line.startswith("ejk hook: ejk_register_kernels [example]") for line in trace), result.stderr
    (choose,) = [line for line in trace if line.startswith("ejk hook: ejk_choose_config [example]")]
    assert "invocation=matmul@2(2x512:float32, 512x2:float32" in choose
    assert "-> ImplChoice(platform='xla', backend='any', implementation='split_k'" in choose
