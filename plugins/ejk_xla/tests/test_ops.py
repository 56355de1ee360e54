"""The public operations end to end with ejk-xla: dispatch, config choice, autotuning, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import (
    MATMUL_SHAPES,
    assert_close,
    check_flash_attention,
    check_flash_attention_lse,
    check_grouped_matmul,
    check_matmul,
    check_ragged_paged_attention,
    reference_flash_attention,
    reference_grouped_matmul,
    reference_matmul,
    reference_ragged_paged_attention,
)
from ejk_xla import FlashAttentionConfig, GroupedMatmulConfig, PagedAttentionConfig
from ejk_xla._flash_attention import config_space as flash_config_space


@pytest.fixture
def events(tmp_path: Path) -> Any:
    """Run the ops through an autotuning Executor with its own cache directory; yield its events."""
    seen: list[ejk.SelectionEvent] = []
    chain = ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(autotune=True, repeats=2),
                                    on_event=seen.append, persistent_dir=tmp_path)
    with ejk.use_executor(ejk.Executor(chain)):
        yield seen


def _qkv(shape_q: tuple[int, ...], shape_kv: tuple[int, ...], dtype: Any = jnp.float32) -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(keys[0], shape_q, dtype), jax.random.normal(keys[1], shape_kv, dtype),
            jax.random.normal(keys[2], shape_kv, dtype))


def test_flash_attention_autotunes_then_reuses(events: list[ejk.SelectionEvent], tmp_path: Path) -> None:
    q, k, v = _qkv((1, 96, 4, 16), (1, 80, 2, 16))
    out = ejk.flash_attention(q, k, v, causal=True)
    assert_close(out, reference_flash_attention(q, k, v, causal=True), jnp.float32)
    (tuned,) = events
    assert tuned.tier == "autotune" and tuned.tune is not None
    assert isinstance(tuned.cfg, ejk.ImplChoice) and tuned.cfg.platform == "xla"
    assert isinstance(tuned.cfg.cfg, FlashAttentionConfig)
    space = flash_config_space(q, k, v)  # every candidate of the xla space was compiled and timed
    assert [t.cfg.cfg for t in tuned.tune.trials] == space and all(t.error is None for t in tuned.tune.trials)
    assert (tmp_path / "flash_attention.json").exists()
    ejk.flash_attention(q, k, v, causal=True)
    assert events[-1].tier == "memory"
    fresh: list[ejk.SelectionEvent] = []
    with ejk.use_executor(ejk.Executor(ejk.ConfigSelectorChain(on_event=fresh.append, persistent_dir=tmp_path))):
        again = ejk.flash_attention(q, k, v, causal=True)
    assert [e.tier for e in fresh] == ["persistent"] and fresh[0].cfg == tuned.cfg
    np.testing.assert_array_equal(out, again)


def test_explicit_cfg_wins_and_is_not_persisted(events: list[ejk.SelectionEvent], tmp_path: Path) -> None:
    q, k, v = _qkv((1, 64, 2, 16), (1, 64, 2, 16))
    cfg = FlashAttentionConfig(block_q=16, block_k=32)
    out = ejk.flash_attention(q, k, v, cfg=cfg)
    assert [e.tier for e in events] == ["override"]
    assert events[0].cfg == ejk.ImplChoice(platform="xla", backend="any", implementation="chunked", cfg=cfg)
    assert not (tmp_path / "flash_attention.json").exists()
    assert_close(out, reference_flash_attention(q, k, v), jnp.float32)


def test_cfg_of_unknown_type_is_rejected() -> None:
    q, k, v = _qkv((1, 8, 2, 16), (1, 8, 2, 16))
    with pytest.raises(ValueError, match="matches no available implementation"):
        ejk.flash_attention(q, k, v, cfg=GroupedMatmulConfig(block_m=8))


def test_heuristic_default_policy_is_not_persisted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EJK_AUTOTUNE", raising=False)
    seen: list[ejk.SelectionEvent] = []
    with ejk.use_executor(ejk.Executor(ejk.ConfigSelectorChain(on_event=seen.append, persistent_dir=tmp_path))):
        a = jnp.arange(12.0).reshape(3, 4)
        b = jnp.ones((4, 5))
        assert_close(ejk.matmul(a, b), reference_matmul(a, b), jnp.float32, kind="matmul")
    assert [e.tier for e in seen] == ["heuristic"]
    assert not list(tmp_path.iterdir())


def test_forced_platform_and_unknown_platform() -> None:
    a, b = jnp.ones((4, 8)), jnp.ones((8, 2))
    np.testing.assert_allclose(ejk.matmul(a, b, platform="xla"), np.full((4, 2), 8.0))
    with pytest.raises(ejk.KernelNotFoundError, match="pip install ejk-triton"):
        ejk.matmul(a, b, platform="triton")
    with pytest.raises(ejk.KernelNotFoundError, match="No implementation of 'matmul'"):
        ejk.matmul(a, b, platform="mykernels")


def test_ops_under_vmap(events: list[ejk.SelectionEvent]) -> None:
    """vmap through the op (the Executor's batching rule). Gradients of the op under jit, with a
    causal sliding window and GQA, are the conformance suite's (test_platform_conformance_suite)."""
    q, k, v = _qkv((2, 32, 4, 16), (2, 48, 2, 16))
    batched = jax.vmap(lambda q, k, v: ejk.flash_attention(q[None], k[None], v[None])[0])(q, k, v)
    assert_close(batched, reference_flash_attention(q, k, v), jnp.float32)


def test_grouped_matmul_tunes_on_realistic_groups(events: list[ejk.SelectionEvent]) -> None:
    keys = jax.random.split(jax.random.key(1), 2)
    lhs = jax.random.normal(keys[0], (40, 16))
    rhs = jax.random.normal(keys[1], (4, 16, 8))
    sizes = jnp.array([10, 0, 25, 3], jnp.int32)
    out = ejk.grouped_matmul(lhs, rhs, sizes)
    assert_close(out, reference_grouped_matmul(lhs, rhs, sizes), jnp.float32, kind="matmul")
    assert events[-1].tier == "autotune"
    assert all(t.error is None for t in events[-1].tune.trials)  # type: ignore[union-attr]
    out = ejk.grouped_matmul(lhs, rhs, sizes, cfg=GroupedMatmulConfig(block_m=8))
    assert_close(out, reference_grouped_matmul(lhs, rhs, sizes), jnp.float32, kind="matmul")


def test_ragged_paged_attention_through_the_op(events: list[ejk.SelectionEvent]) -> None:
    rng = np.random.default_rng(0)
    pages, page, heads, kv_heads, dim = 12, 4, 4, 2, 16
    k_pages = jnp.asarray(rng.standard_normal((pages, page, kv_heads, dim)), jnp.float32)
    v_pages = jnp.asarray(rng.standard_normal((pages, page, kv_heads, dim)), jnp.float32)
    kv_lens = jnp.array([9, 5, 16], jnp.int32)
    page_indices = jnp.asarray(rng.permutation(pages).reshape(3, 4), jnp.int32)
    cu_q_lens = jnp.array([0, 1, 4, 6], jnp.int32)
    q = jnp.asarray(rng.standard_normal((6, heads, dim)), jnp.float32)
    args = (q, k_pages, v_pages, kv_lens, page_indices, cu_q_lens, 3)
    out = ejk.ragged_paged_attention(*args, logits_soft_cap=20.0)
    want = reference_ragged_paged_attention(*args, logits_soft_cap=20.0)
    assert_close(out, want, jnp.float32, kind="paged")
    assert events[-1].tier == "autotune"
    assert all(t.error is None for t in events[-1].tune.trials)  # type: ignore[union-attr]
    out = ejk.ragged_paged_attention(*args, logits_soft_cap=20.0, cfg=PagedAttentionConfig(pages_per_block=1))
    assert_close(out, want, jnp.float32, kind="paged")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ejk.flash_attention(jnp.ones((1, 4, 3, 8)), jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 8))),
         "multiple"),
        (lambda: ejk.flash_attention(jnp.ones((1, 4, 2, 8)), jnp.ones((1, 4, 2, 4)), jnp.ones((1, 4, 2, 8))), "k"),
        (lambda: ejk.matmul(jnp.ones((2, 3)), jnp.ones((4, 5))), "b"),
        (lambda: ejk.grouped_matmul(jnp.ones((4, 3)), jnp.ones((2, 3, 5)), jnp.array([3, 3], jnp.int32)),
         "group_sizes"),
    ],
)
def test_bad_input_names_the_argument(call: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_signatures_of_registered_implementations_agree() -> None:
    for algorithm in ejk.kernel_registry.list_algorithms():
        assert ejk.kernel_registry.validate_signatures(algorithm) is True


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(
    "check", [check_flash_attention, check_flash_attention_lse, check_matmul, check_grouped_matmul,
              check_ragged_paged_attention]
)
def test_platform_conformance_suite(check: Any, dtype: Any) -> None:
    """The conformance checks every platform runs (ejk.testing), here for xla (one dtype per test,
    so that the test workers share them)."""
    assert check("xla", dtypes=(dtype,)) > 0


def test_matmul_conformance_with_precision_and_output_dtype() -> None:
    """The conformance checks pass precision / preferred_element_type to the op and the reference alike."""
    shapes = MATMUL_SHAPES[3:7]  # broadcasting batch dimensions and 1-D operands
    assert check_matmul("xla", dtypes=(jnp.bfloat16,), precision=("default", "highest"),
                        preferred_element_type=jnp.float32, shapes=shapes) == len(shapes)
    assert check_grouped_matmul("xla", dtypes=(jnp.bfloat16,), preferred_element_type=jnp.float32) > 0
