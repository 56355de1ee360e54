"""record_invocation / get_invocations, and recording by the Executor."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk import ConfigSelectorChain, Executor, Kernel, get_invocations, record_invocation
from ejk.config.tuning import AutotunePolicy
from ejk.execution.device import device_fingerprint


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def test_record_stores_abstract_shapes_and_copies_containers() -> None:
    x = jnp.ones((2, 3), jnp.float32)
    y = np.zeros((4,), np.int32)
    args = [x, {"y": y, "n": 3}]
    kwargs = {"causal": True, "mask": jnp.ones((5,), jnp.bool_)}
    record_invocation("dev0", "op@1", "key1", "the-kernel", args, kwargs)
    args.append("mutated")
    kwargs["extra"] = 1

    recorded = get_invocations("dev0")
    assert list(recorded) == ["op@1"]
    kernel, stored_args, stored_kwargs = recorded["op@1"]["key1"]
    assert kernel == "the-kernel"
    assert isinstance(stored_args, tuple) and len(stored_args) == 2
    assert stored_args[0] == jax.ShapeDtypeStruct((2, 3), jnp.float32)
    assert stored_args[1]["y"] == jax.ShapeDtypeStruct((4,), jnp.int32)
    assert stored_args[1]["n"] == 3
    assert stored_kwargs == {"causal": True, "mask": jax.ShapeDtypeStruct((5,), jnp.bool_)}


def test_get_invocations_returns_a_copy() -> None:
    record_invocation("dev0", "op@1", "key1", None, (jnp.ones(2),), {})
    first = get_invocations("dev0")
    first["op@1"].clear()
    first["other@1"] = {}
    second = get_invocations("dev0")
    assert list(second) == ["op@1"]
    assert list(second["op@1"]) == ["key1"]


def test_unknown_device_gives_empty_dict() -> None:
    assert get_invocations("no-such-device") == {}
    record_invocation("dev0", "op@1", "key1", None, (), {})
    assert get_invocations("dev1") == {}


def test_records_are_grouped_by_device_op_and_call_key() -> None:
    record_invocation("dev0", "op@1", "a", None, (jnp.ones(1),), {})
    record_invocation("dev0", "op@1", "b", None, (jnp.ones(2),), {})
    record_invocation("dev0", "op@2", "a", None, (jnp.ones(3),), {})
    record_invocation("dev1", "op@1", "a", None, (jnp.ones(4),), {})
    record_invocation("dev0", "op@1", "a", None, (jnp.ones(5),), {})  # same key: replaced
    dev0 = get_invocations("dev0")
    assert sorted(dev0) == ["op@1", "op@2"]
    assert sorted(dev0["op@1"]) == ["a", "b"]
    assert dev0["op@1"]["a"][1][0].shape == (5,)
    assert get_invocations("dev1")["op@1"]["a"][1][0].shape == (4,)


def test_recording_inside_jit_never_stores_tracers() -> None:
    @jax.jit
    def f(x: jax.Array, y: jax.Array) -> jax.Array:
        record_invocation("dev0", "op@1", "traced", None, (x, (y,)), {"z": x[0]})
        return x * 2

    f(jnp.ones((3,), jnp.bfloat16), jnp.ones((2, 2), jnp.float16))
    _, args, kwargs = get_invocations("dev0")["op@1"]["traced"]
    leaves = jax.tree.leaves((args, kwargs))
    assert leaves and not any(_is_tracer(leaf) for leaf in leaves)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)
    assert args == (jax.ShapeDtypeStruct((3,), jnp.bfloat16), (jax.ShapeDtypeStruct((2, 2), jnp.float16),))
    assert kwargs == {"z": jax.ShapeDtypeStruct((), jnp.bfloat16)}


class Double(Kernel[int, jax.Array]):
    op_id = "double"
    version = "3"

    def run(self, x: jax.Array, *, cfg: int, scale: float = 1.0) -> jax.Array:
        return x * cfg * scale

    def heuristic_cfg(self, inv: Any) -> int:
        return 2


def _executor() -> Executor[int, jax.Array]:
    return Executor(ConfigSelectorChain(policy=AutotunePolicy(autotune=False), plugin_host=False, persist=False))


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_executor_records_when_enabled(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("EJKERNEL_OPS_RECORD", value)
    ex = _executor()
    x = jnp.arange(4.0)
    np.testing.assert_allclose(ex(Double(), x, scale=0.5), x)
    jax.jit(lambda v: ex(Double(), v))(jnp.ones((2, 2), jnp.bfloat16))

    recorded = get_invocations(device_fingerprint())
    assert list(recorded) == ["double@3"]
    calls = recorded["double@3"]
    assert len(calls) == 2
    inv = ex.invocation(Double(), (x,), {"scale": 0.5})
    kernel, args, kwargs = calls[inv.call_key]
    assert isinstance(kernel, Double)
    assert args == (jax.ShapeDtypeStruct((4,), jnp.float32),)
    assert kwargs == {"scale": 0.5}
    leaves = jax.tree.leaves([v[1:] for v in calls.values()])
    assert not any(_is_tracer(leaf) for leaf in leaves)


def test_executor_does_not_record_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _executor()
    ex(Double(), jnp.ones(3))
    monkeypatch.setenv("EJKERNEL_OPS_RECORD", "0")
    ex(Double(), jnp.ones(3))
    assert get_invocations(device_fingerprint()) == {}
