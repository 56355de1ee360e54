"""Invocation and make_call_key: stable across processes, distinct for distinct signatures."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk import Invocation
from ejk.execution.kernel import abstract_args, make_call_key, static_key


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


@attrs.frozen
class Block:
    m: int
    n: int


@dataclasses.dataclass(frozen=True)
class Tile:
    k: int


def key(*args: Any, op: str = "op@1", batch_axes: Any = None, **kwargs: Any) -> str:
    return make_call_key(op, args, kwargs, batch_axes)


SIGNATURES: dict[str, tuple[tuple[Any, ...], dict[str, Any], Any]] = {
    "f32": ((jax.ShapeDtypeStruct((8, 16), jnp.float32),), {"causal": True, "mode": Mode.FAST}, None),
    "bf16-tree": (({"q": jax.ShapeDtypeStruct((2, 4), jnp.bfloat16), "n": None},), {"block": Block(m=1, n=2)}, (0,)),
    "mixed": ((jax.ShapeDtypeStruct((3,), jnp.int32), 2.5), {"tile": Tile(k=4), "dtype": np.dtype("float16"),
                                                             "scale": 0.125, "names": ("a", "b")}, None),
}

_SUBPROCESS = textwrap.dedent(
    """
    import dataclasses, enum, json, sys
    import attrs, jax, jax.numpy as jnp, numpy as np
    from ejk.execution.kernel import make_call_key

    class Mode(enum.Enum):
        FAST = "fast"
        SAFE = "safe"

    @attrs.frozen
    class Block:
        m: int
        n: int

    @dataclasses.dataclass(frozen=True)
    class Tile:
        k: int

    for cls in (Mode, Block, Tile):
        cls.__module__ = MODULE
        cls.__qualname__ = cls.__name__

    SIGNATURES = {
        "f32": ((jax.ShapeDtypeStruct((8, 16), jnp.float32),), {"causal": True, "mode": Mode.FAST}, None),
        "bf16-tree": (({"q": jax.ShapeDtypeStruct((2, 4), jnp.bfloat16), "n": None},), {"block": Block(m=1, n=2)},
                      (0,)),
        "mixed": ((jax.ShapeDtypeStruct((3,), jnp.int32), 2.5), {"tile": Tile(k=4), "dtype": np.dtype("float16"),
                                                                 "scale": 0.125, "names": ("a", "b")}, None),
    }
    print(json.dumps({name: make_call_key("op@1", a, kw, b) for name, (a, kw, b) in SIGNATURES.items()}))
    """
)


def test_call_key_is_stable_across_processes() -> None:
    here = {name: make_call_key("op@1", a, kw, b) for name, (a, kw, b) in SIGNATURES.items()}
    source = f"MODULE = {__name__!r}\n" + _SUBPROCESS
    env = {**os.environ, "PYTHONHASHSEED": "12345", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    there = json.loads(proc.stdout.strip().splitlines()[-1])
    assert there == here
    assert len(set(here.values())) == len(here)


def test_call_key_does_not_depend_on_array_values_or_kind() -> None:
    a = key(jnp.ones((4, 4)), causal=True)
    assert a == key(jnp.zeros((4, 4)), causal=True)
    assert a == key(np.full((4, 4), 3.0, np.float32), causal=True)
    assert a == key(jax.ShapeDtypeStruct((4, 4), jnp.float32), causal=True)
    assert len(a) == 32 and all(c in "0123456789abcdef" for c in a)


@pytest.mark.parametrize("dtypes", [(jnp.float32, jnp.bfloat16), (jnp.float32, jnp.float16),
                                    (jnp.bfloat16, jnp.float16), (jnp.int32, jnp.uint32),
                                    (jnp.int8, jnp.bool_)])
def test_call_key_differs_by_dtype(dtypes: tuple[Any, Any]) -> None:
    first, second = (key(jax.ShapeDtypeStruct((8, 8), d)) for d in dtypes)
    assert first != second


def test_call_key_distinguishes_all_float_dtypes() -> None:
    keys = {key(jnp.ones((2, 2), d)) for d in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64)
            if d != jnp.float64 or jax.config.jax_enable_x64}
    assert len(keys) == (4 if jax.config.jax_enable_x64 else 3)


def test_call_key_differs_by_shape_and_structure() -> None:
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    keys = {
        key(x),
        key(jax.ShapeDtypeStruct((8, 4), jnp.float32)),
        key(jax.ShapeDtypeStruct((4, 8), jnp.float32)),
        key(jax.ShapeDtypeStruct((64,), jnp.float32)),
        key(x, x),
        key((x, x)),
        key({"a": x}),
        key({"b": x}),
        key(x, None),
    }
    assert len(keys) == 9


def test_call_key_differs_by_static_kwargs() -> None:
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    keys = {
        key(x),
        key(x, causal=True),
        key(x, causal=False),
        key(x, window=1),
        key(x, window=2),
        key(x, scale=0.5),
        key(x, scale=0.25),
        key(x, mode=Mode.FAST),
        key(x, mode=Mode.SAFE),
        key(x, mode="fast"),
        key(x, block=Block(m=1, n=2)),
        key(x, block=Block(m=2, n=1)),
        key(x, dtype=jnp.dtype("bfloat16")),
        key(x, dtype=np.dtype("float16")),
    }
    assert len(keys) == 14
    assert key(x, a=1, b=2) == key(x, b=2, a=1)  # keyword order does not matter


def test_call_key_differs_by_batch_axes_and_op() -> None:
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    keys = {key(x), key(x, batch_axes=0), key(x, batch_axes=1), key(x, batch_axes=(0, None)),
            key(x, op="op@2"), key(x, op="other@1")}
    assert len(keys) == 6


def test_call_key_rejects_values_without_a_stable_form() -> None:
    x = jnp.ones(2)

    class Opaque:
        pass

    for value in (object(), Opaque(), {1, 2}):
        with pytest.raises(TypeError, match="stable cache key"):
            key(x, thing=value)
    with pytest.raises(TypeError, match="batch_axes"):
        key(x, batch_axes=Opaque())
    with pytest.raises(TypeError, match="positional argument"):
        key(x, Opaque())


def test_static_key_has_no_memory_addresses() -> None:
    def helper() -> None:
        pass

    payload = json.dumps(static_key({"fn": helper, "block": Block(1, 2), "tile": Tile(3), "mode": Mode.SAFE,
                                     "dtype": np.float32, "inf": float("inf"), "np": np.int64(3)}))
    assert "0x" not in payload
    assert "test_static_key_has_no_memory_addresses.<locals>.helper" in payload
    assert '"inf": "inf"' in payload
    assert '"np": 3' in payload


def test_invocation_properties() -> None:
    x = jnp.ones((2, 3), jnp.bfloat16)
    inv = Invocation(op_id="op", version="7", args=(x, {"y": np.zeros(4, np.int8)}), kwargs={"causal": True},
                     call_key="abc", device="cpu|cpu")
    assert inv.op_id_v == "op@7"
    assert inv.cache_key == ("cpu|cpu", "op@7", "abc")
    assert inv.abstract_args == (jax.ShapeDtypeStruct((2, 3), jnp.bfloat16),
                                 {"y": jax.ShapeDtypeStruct((4,), jnp.int8)})
    assert inv.override_cfg is None
    assert abstract_args([x]) == [jax.ShapeDtypeStruct((2, 3), jnp.bfloat16)]
