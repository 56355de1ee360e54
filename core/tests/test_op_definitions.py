"""The built-in ops are one folder each, tied together by their definition: everything reads it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ejk
import ejk.ops
import ejk.testing
from ejk import bench
from ejk.bench import _cases
from ejk.ops import BUILTIN_OPS, builtin_ops, get_op


def test_every_builtin_op_is_defined_from_its_folder() -> None:
    definitions = builtin_ops()
    assert tuple(d.name for d in definitions) == BUILTIN_OPS
    assert get_op("flash_attention").variants == ("flash_attention_lse",)
    assert get_op("flash_attention_lse").variant_of == "flash_attention"
    assert get_op("flash_attention_lse").check_fn() is not None
    for definition in definitions:
        assert definition.function.__module__ == f"ejk.ops._{definition.name}._op"
        for part in (definition.reference_fn(), definition.check_fn(), definition.shard_rule_fn(),
                     definition.bench_spec()):
            assert part is not None, f"{definition.name} lacks a part of its definition"


@pytest.mark.parametrize("name", BUILTIN_OPS)
def test_the_testing_names_of_an_op_are_its_definitions(name: str) -> None:
    definition = get_op(name)
    assert getattr(ejk.testing, f"reference_{name}") is definition.reference_fn()
    assert getattr(ejk.testing, f"check_{name}") is definition.check_fn()


def test_an_unknown_testing_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="reference_nope"):
        ejk.testing.reference_nope  # noqa: B018


def _type_checking_imports(module: ast.Module) -> set[str]:
    for node in module.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return {alias.name for sub in node.body if isinstance(sub, ast.ImportFrom) for alias in sub.names}
    return set()


def test_the_static_lists_of_ejk_name_every_defined_builtin_op() -> None:
    """``ejk.<op>`` comes from the definitions at run time; the lists tools and mypy read must agree."""
    names = {name for d in builtin_ops() for name in (d.name, *d.variants)}
    source = ast.parse(Path(ejk.__file__).read_text())
    assert names <= set(ejk.__all__)
    assert names <= _type_checking_imports(source)
    assert names <= set(ejk.ops.__all__)
    for name in names:
        assert getattr(ejk, name) is get_op(name).function


def test_ejk_bench_reads_the_ops_workloads() -> None:
    for definition in builtin_ops():
        spec = definition.bench_spec()
        assert _cases.CASE_TYPES[definition.name] is spec.case
        assert bench.resolve_op(spec.preset) == definition.name
        assert bench.PRESETS[spec.preset] == spec.presets
        assert type(bench.workload_for(spec.quick[0], "float32")) is spec.workload
