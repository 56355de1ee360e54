"""How the shard rules split calls (planning only: no devices, no plugins)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from ejk.ops import get_op
from ejk.ops._grouped_matmul._shard import local_group_sizes

MESH = {"x": 2, "y": 4}


def _plan(op: str, arrays: tuple[Any, ...], layout: dict[int, tuple[Any, ...]]) -> Any:
    """The rule's plan when ``arrays[i]`` is sharded per dim as ``layout[i]`` (axes tuples)."""

    def axes_of(x: Any, dim: int) -> tuple[str, ...]:
        for i, spec in layout.items():
            if arrays[i] is x and dim < len(spec):
                return spec[dim]
        return ()

    return get_op(op).shard_rule_fn()(arrays, axes_of, lambda axes: math.prod(MESH[a] for a in axes))


def _sds(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


GMM = (_sds(32, 16), _sds(8, 16, 8), _sds(8))


@pytest.mark.parametrize(("layout", "lhs", "rhs", "out", "combines"), [
    ({1: ((), (), ("y",))}, P(None, None), P(None, None, "y"), P(None, "y"), False),  # columns: no body
    ({1: (("y",),)}, P(None, None), P("y", None, None), P(None, None), True),  # experts: psum
    ({0: (("y",),), 1: (("y",),)}, P("y", None), P("y", None, None), P("y", None), True),  # reduce-scatter
    ({0: (("x",),), 1: (("y",),)}, P("x", None), P("y", None, None), P("x", None), True),
    ({0: ((), ("x",))}, P(None, "x"), P(None, "x", None), P(None, None), True),  # contraction: psum
    # Experts and columns on one axis: the columns win, the experts are gathered.
    ({1: (("y",), (), ("y",))}, P(None, None), P(None, None, "y"), P(None, "y"), False),
])
def test_grouped_matmul_plans(layout: dict[int, Any], lhs: P, rhs: P, out: P, combines: bool) -> None:
    plan = _plan("grouped_matmul", GMM, layout)
    assert plan.in_specs == (lhs, rhs, P(None))
    assert plan.out_specs == out
    assert (plan.body is not None) == combines


def test_experts_that_do_not_divide_the_shards_are_gathered() -> None:
    plan = _plan("grouped_matmul", (_sds(32, 16), _sds(6, 16, 8), _sds(6)), {1: (("y",),)})
    assert plan.in_specs[1] == P(None, None, None) and plan.body is None


def test_matmul_splits_the_contraction_with_a_psum() -> None:
    plan = _plan("matmul", (_sds(4, 8, 16), _sds(16, 8)), {0: ((), ("x",), ("y",))})
    assert plan.in_specs == (P(None, "x", "y"), P("y", None)) and plan.out_specs == P(None, "x", None)
    assert plan.body is not None
    assert _plan("matmul", (_sds(4, 8, 16), _sds(16, 8)), {0: (("x",),)}).body is None


def test_batched_matmul_splits_batch_dims_of_both_operands() -> None:
    a, b, b1 = _sds(4, 8, 16), _sds(4, 16, 8), _sds(1, 16, 8)
    plan = _plan("matmul", (a, b), {0: (("x",),), 1: ((), (), ("y",))})
    assert plan.in_specs == (P("x", None, None), P("x", None, "y")) and plan.out_specs == P("x", None, "y")
    plan = _plan("matmul", (a, b1), {0: (("x",),)})  # b broadcasts along the batch: it stays whole
    assert plan.in_specs == (P("x", None, None), P(None, None, None)) and plan.out_specs == P("x", None, None)
    plan = _plan("matmul", (_sds(8, 16), b), {1: (("x",),)})  # a broadcasts; the batch comes from b
    assert plan.in_specs == (P(None, None), P("x", None, None)) and plan.out_specs == P("x", None, None)
    assert _plan("matmul", (_sds(16), b), {1: (("x",),)}) is None  # a vector runs whole


def test_paged_attention_splits_tokens() -> None:
    arrays = (_sds(16, 4, 8), _sds(6, 4, 2, 8), _sds(6, 4, 2, 8), _sds(3), _sds(3, 2), _sds(4), _sds())
    plan = _plan("ragged_paged_attention", arrays, {0: (("y",), ("x",))})
    assert plan.in_specs[0] == P("y", "x", None) and plan.in_specs[1] == P(None, None, "x", None)
    assert plan.out_specs == P("y", "x", None) and plan.body is not None


@pytest.mark.parametrize(("rows", "first_row", "first_group", "groups"), [
    (32, 0, 0, 8), (8, 8, 0, 8), (8, 24, 0, 8), (32, 0, 2, 2), (32, 0, 6, 2), (16, 16, 4, 4), (8, 0, 4, 4)])
def test_local_group_sizes_clip_groups_to_the_block(rows: int, first_row: int, first_group: int, groups: int) -> None:
    sizes = np.array([0, 5, 0, 7, 3, 0, 9, 2], np.int32)
    got, offset = local_group_sizes(jnp.asarray(sizes), rows, first_row, first_group, groups)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    want = [max(0, min(e, first_row + rows) - max(s, first_row))
            for s, e in zip(starts[first_group:first_group + groups], ends[first_group:first_group + groups],
                            strict=True)]
    np.testing.assert_array_equal(np.asarray(got), want)
    assert int(offset) == min(max(starts[first_group] - first_row, 0), rows)
