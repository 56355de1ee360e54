"""The eager fast path of every built-in op (issue 31): identical eager calls skip validation and dispatch,
never return a stale result, and still check the values of their integer arrays."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
import ejk.plugins
from ejk.bench._cases import PRESET_OF_OP, QUICK
from ejk.bench._workloads import workload_for
from ejk.ops import BUILTIN_OPS, get_op, set_default_executor
from ejk.plugins import PlatformStatus

#: A case of each op with packed sequences where it has them (their offsets are value-checked).
_CASES = {op: QUICK[PRESET_OF_OP[op]][-1 if op in ("gated_delta_rule", "gla", "ssd") else 0] for op in BUILTIN_OPS}


_SHAPES: dict[Any, Any] = {}  # the outputs' shapes of each call (tracing a reference for them is slow)


def _fake(op: str, offset: float, traced: list[str]) -> Callable[..., Any]:
    """An implementation of ``op`` whose first output is filled with ``offset`` (which one ran shows)."""
    output = get_op(op).output_fn()
    assert output is not None

    kernel = get_op(op).kernel
    named = kernel.array_names[kernel.positional:]  # the optional arrays come by keyword

    def impl(*given: Any, cfg: Any = None, **static: Any) -> Any:
        traced.append(f"{op}+{offset}")
        arrays = (*given, *(static.pop(name, None) for name in named))
        key = (tuple(None if x is None else (x.shape, str(x.dtype)) for x in arrays), repr(sorted(static.items())))
        shapes = _SHAPES.get(key)
        if shapes is None:
            shapes = _SHAPES[key] = jax.eval_shape(lambda *xs: output(*xs, **static), *arrays)
        leaves, tree = jax.tree.flatten(shapes)  # the first output holds the offset, the others zeros
        return jax.tree.unflatten(tree, [jnp.full(s.shape, offset if i == 0 else 0, s.dtype)
                                         for i, s in enumerate(leaves)])

    keyword, positional = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    impl.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, positional) for name in kernel.array_names[:kernel.positional]]
        + [inspect.Parameter(name, keyword, default=None) for name in (*named, *(get_op(op).static_names() or ()))]
        + [inspect.Parameter("cfg", keyword, default=None)])
    return impl


def _install(name: str, offset: float, traced: list[str], priority: int = 0) -> None:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            for op in BUILTIN_OPS:
                register(op, "fake", "any", name=name, priority=priority)(_fake(op, offset, traced))

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="fake", available=True)

    ejk.plugins.get_plugin_host().register_plugin(Plugin(), f"plugin-{name}")


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    registry = ejk.plugins.get_plugin_host().registry
    for op in BUILTIN_OPS:
        monkeypatch.setattr(get_op(op).kernel, "registry", registry)
    set_default_executor(None)
    found: list[str] = []
    _install("first", 1.0, found)
    yield found
    set_default_executor(None)


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls that took the full path: validated, then dispatched by the Executor (op ids)."""
    count: list[str] = []
    dispatch = ejk.Executor.__call__

    def counted(self: Any, kernel: Any, *args: Any, **kwargs: Any) -> Any:
        count.append(kernel.op_id)
        return dispatch(self, kernel, *args, **kwargs)

    monkeypatch.setattr(ejk.Executor, "__call__", counted)
    return count


def _zeros(workload: Any) -> tuple[Any, ...]:
    """The workload's inputs as zeros (valid lengths, offsets and tables; quick to make: no random kernels
    to compile; the fake implementations read no value)."""
    return tuple(jnp.zeros(s.shape, s.dtype) for s in jax.eval_shape(lambda: workload.inputs(0)))


def _call(op: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    workload = workload_for(_CASES[op], "float32")
    return workload.call(platform="auto"), _zeros(workload)


def _values(out: Any) -> set[float]:
    return {float(np.asarray(x).reshape(-1)[0]) for x in jax.tree.leaves(out) if np.asarray(x).size}


def _untraced(op: str, concrete: bool) -> bool:
    """Whether the eager fast path runs without tracing the op's function again (ops whose function does
    array work of its own compile it whole at the second call; concrete values: none is a tracer)."""
    return op not in ("flash_attention_varlen", "linear_cross_entropy") and concrete


@pytest.mark.parametrize("op", BUILTIN_OPS)
def test_the_fast_path_settles_and_never_returns_a_stale_result(op: str, traced: list[str], validations: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    call, inputs = _call(op)
    first = call(*inputs)
    for _ in range(3):
        again = call(*inputs)
        assert str(jax.tree.structure(again)) == str(jax.tree.structure(first))
        for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(first), strict=True):
            np.testing.assert_array_equal(a, b)
    assert len(validations) <= 2 and len(traced) <= 2  # the first call (and the whole function's trace)
    assert set(validations) == {op}
    before = len(validations)
    call(*inputs)
    assert len(validations) == before  # settled: neither validated nor traced any more
    cases = QUICK[PRESET_OF_OP[op]]
    other = workload_for(cases[1] if _CASES[op] is cases[0] else cases[0], "float32")
    other.call(platform="auto")(*_zeros(other))  # other shapes: the full path
    assert len(validations) == before + 1
    executor: ejk.Executor[Any, Any] = ejk.Executor(
        ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(mode="heuristics"), persist=False))
    with ejk.use_executor(executor):  # another Executor decides for itself
        call(*inputs)
    assert len(validations) == before + 2
    with monkeypatch.context() as env:  # calls being recorded: every one through the Executor
        env.setenv("EJKERNEL_OPS_RECORD", "1")
        call(*inputs)
    assert len(validations) == before + 3
    _install("second", 100.0, traced, priority=50)
    ejk.ops.get_default_executor().chooser.clear_memory()  # type: ignore[attr-defined]  # the decision goes
    for _ in range(3):
        assert 100.0 in _values(call(*inputs)) <= {100.0, 0.0}


#: For each op whose validation reads array values: the input (position or keyword) to spoil and a bad value.
_BAD: dict[str, tuple[int | str, Callable[[Any], Any], str]] = {
    "grouped_matmul": (2, lambda x: x.at[0].set(-1), "group_sizes"),
    "mla_paged_attention": (2, lambda x: x.at[0].set(-1), "kv_lens"),
    "ragged_paged_attention": (6, lambda x: x + 1000, "num_seqs"),
    "flash_attention_varlen": (3, lambda x: x.at[1].set(x[-1] + 1), "cu_seqlens_q"),
    "linear_cross_entropy": (2, lambda x: x.at[0].set(10**6), "labels"),
    "gated_delta_rule": ("cu_seqlens", lambda x: x.at[1].set(x[-1] + 5), "cu_seqlens"),
    "gla": ("cu_seqlens", lambda x: x.at[1].set(x[-1] + 5), "cu_seqlens"),
    "ssd": ("cu_seqlens", lambda x: x.at[1].set(x[-1] + 5), "cu_seqlens"),
}


@pytest.mark.parametrize("op", sorted(_BAD))
def test_values_are_checked_on_the_fast_path(op: str, traced: list[str]) -> None:
    workload = workload_for(_CASES[op], "float32")
    where, spoil, name = _BAD[op]
    inputs = _zeros(workload)
    positional, kwargs = workload.split_inputs(inputs)
    function = get_op(op).function
    for _ in range(3):  # the fast path, settled
        function(*positional, **kwargs)
    if isinstance(where, int):
        bad_positional, bad_kwargs = list(positional), kwargs
        bad_positional[where] = spoil(positional[where])
    else:
        bad_positional, bad_kwargs = list(positional), {**kwargs, where: spoil(kwargs[where])}
    for _ in range(2):
        with pytest.raises(ValueError, match=name):
            function(*bad_positional, **bad_kwargs)
    function(*positional, **kwargs)  # the good arrays again: still fine


def test_the_recurrent_ops_final_state_follows_the_flag(traced: list[str]) -> None:
    workload = workload_for(_CASES["gla"], "float32")
    positional, kwargs = workload.split_inputs(_zeros(workload))
    for _ in range(2):
        assert ejk.gla(*positional, **kwargs)[1] is None
        assert ejk.gla(*positional, **kwargs, output_final_state=True)[1] is not None


def test_an_argument_converted_by_the_validation_runs_the_whole_function(traced: list[str],
                                                                         validations: list[str]) -> None:
    workload = workload_for(_CASES["ragged_paged_attention"], "float32")
    positional = list(_zeros(workload))
    positional[6] = int(positional[6])  # num_seqs as a Python int: made an array by the validation
    outs = [ejk.ragged_paged_attention(*positional) for _ in range(4)]
    assert len(validations) == 2  # the first call, then the whole function's trace; then neither
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_a_function_that_cannot_be_traced_stays_eager(traced: list[str], validations: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ejk.ops import _eager

    attempts: list[int] = []

    def refusing(*args: Any) -> Any:
        def call(*arrays: Any) -> Any:
            attempts.append(1)
            raise TypeError("not traceable here")

        return call, ()

    monkeypatch.setattr(_eager, "_jit_whole", refusing)
    call, inputs = _call("linear_cross_entropy")
    outs = [call(*inputs) for _ in range(4)]
    assert len(attempts) == 1  # tried once; then the function runs eagerly (its kernel call remembered)
    assert len(validations) == 1 and all(float(out) == float(outs[0]) for out in outs)
