"""``ejk explain`` on the command line covers every op: ragged_paged_attention and an op a plugin
defines, described with --arg / --static or by the op's first sample call (issue 28)."""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugins
import ejk.registry
from ejk import cli
from ejk.ops import OPS, OpKernel, define_op
from ejk.plugins import PlatformStatus


class ScaleKernel(OpKernel):
    op_id = "cli_scale"
    version = "1"
    array_names = ("x",)
    positional = 1

    def normalize(self, x: Any, *, factor: float = 2.0) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x,), {"factor": float(factor)}


def scale(x: jax.Array, *, factor: float = 2.0, platform: str = "auto", cfg: Any = None) -> jax.Array:
    raise NotImplementedError  # explain never runs it


define_op(ScaleKernel(), scale, reference=lambda x, *, factor: x * factor)


def scaled(x: jax.Array, *, factor: float, cfg: Any = None) -> jax.Array:
    return x * factor


def paged(q: Any, k_pages: Any, v_pages: Any, kv_lens: Any, page_indices: Any, cu_q_lens: Any, num_seqs: Any, *,
          softmax_scale: float, sliding_window: Any, logits_soft_cap: Any, cfg: Any = None) -> jax.Array:
    return jnp.zeros_like(q)


class Toy:
    @ejk.hookimpl
    def ejk_register_kernels(self, register: Any) -> None:
        register("cli_scale", "xla", "any", name="scaled")(scaled)
        register("ragged_paged_attention", "xla", "any", name="toy")(paged)

    @ejk.hookimpl
    def ejk_platform_status(self) -> PlatformStatus:
        return PlatformStatus(platform="xla", available=True)


@pytest.fixture(autouse=True)
def _toy(monkeypatch: pytest.MonkeyPatch) -> None:
    host = ejk.plugins.get_plugin_host()  # the private, empty host of conftest
    host.register_plugin(Toy(), "toy")
    monkeypatch.setattr(ejk.registry, "kernel_registry", host.registry)
    for name in ("cli_scale", "ragged_paged_attention"):  # the op kernels look in the private registry
        monkeypatch.setattr(OPS[name].kernel, "registry", host.registry)


def _explain(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert cli.main(["explain", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_explain_a_plugins_op_by_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    found = _explain(capsys, "cli_scale", "--arg", "x=8x16", "--static", "factor=3", "--dtype", "float32")
    assert found["chosen"].startswith("xla/any:scaled") and "8x16:float32" in found["call"]
    assert "factor=3.0" in found["call"]


def test_explain_ragged_paged_attention_by_arguments_or_its_sample_call(capsys: pytest.CaptureFixture[str]) -> None:
    found = _explain(capsys, "ragged_paged_attention", "--arg", "q=9x4x16", "--arg", "k_pages=9x4x2x16",
                     "--arg", "v_pages=9x4x2x16", "--arg", "kv_lens=3:int32", "--arg", "page_indices=3x3:int32",
                     "--arg", "cu_q_lens=4:int32", "--static", "num_seqs=3")
    assert found["chosen"].startswith("xla/any:toy")
    assert _explain(capsys, "ragged_paged_attention")["chosen"].startswith("xla/any:toy")


def test_explain_names_a_missing_argument_and_an_unknown_op(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="--arg k_pages=SHAPE"):
        cli.main(["explain", "ragged_paged_attention", "--arg", "q=9x4x16"])
    assert cli.main(["explain", "no_such_op", "--arg", "x=4"]) == 2
    assert "unknown operation 'no_such_op'" in capsys.readouterr().out
