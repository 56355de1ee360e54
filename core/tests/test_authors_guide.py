"""The authors' guide (docs/KERNEL_CONTRACT.md, docs/PLUGIN_AUTHORS.md) gives each built-in op's
implementation, VJP forward and backward signatures, and names every residual tag ejk exports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ejk.ops
import ejk.plugin

DOCS = Path(__file__).resolve().parents[2] / "docs"
TAGS = ("FLASH_RESIDUALS", "FLASH_LSE_RESIDUALS", "MATMUL_RESIDUALS", "GROUPED_MATMUL_RESIDUALS")
DIFFERENTIABLE = ("flash_attention", "flash_attention_lse", "matmul", "grouped_matmul")

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason="the docs are not beside this checkout's tests")


def _section(text: str, op: str) -> str:
    match = re.search(rf"^## {op}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"KERNEL_CONTRACT.md has no section '## {op}'"
    return match.group(1)


@pytest.mark.parametrize("name", TAGS)
def test_every_residual_tag_is_exported_from_ejk_ops_and_ejk_plugin(name: str) -> None:
    assert getattr(ejk.ops, name) == getattr(ejk.plugin, name) and name in ejk.ops.__all__


@pytest.mark.parametrize("name", TAGS)
def test_the_guide_lists_every_residual_tag(name: str) -> None:
    tag = getattr(ejk.ops, name)
    contract = (DOCS / "KERNEL_CONTRACT.md").read_text(encoding="utf-8")
    assert f"`{tag}`" in contract and name in contract
    assert name in (DOCS / "PLUGIN_AUTHORS.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("op", DIFFERENTIABLE)
def test_the_contract_gives_the_vjp_signatures_of_each_differentiable_op(op: str) -> None:
    section = _section((DOCS / "KERNEL_CONTRACT.md").read_text(encoding="utf-8"), op)
    assert re.search(r"^\s+impl\(", section, flags=re.M), section
    assert re.search(r"^\s+fwd\(.*\)\s*->\s*\(", section, flags=re.M | re.S), section
    assert re.search(r"^\s+bwd\(residuals, ", section, flags=re.M), section
    assert "residuals" in section and "RESIDUALS" in section


def test_the_contract_says_ragged_paged_attention_has_no_residual_tag() -> None:
    section = _section((DOCS / "KERNEL_CONTRACT.md").read_text(encoding="utf-8"), "ragged_paged_attention")
    assert "no residual tag" in section
