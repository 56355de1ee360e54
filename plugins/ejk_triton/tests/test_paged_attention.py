"""The Triton ragged paged attention against the per-sequence reference: values, masks, edges, gates, configs.

On a CPU the kernel runs through Triton's interpreter (``EJK_TRITON_INTERPRET=1``, see conftest.py),
so the shapes are small; tests marked ``gpu`` run real sizes compiled on an NVIDIA GPU.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_op, reference_ragged_paged_attention
from ejk_triton import _env
from ejk_triton import _paged_attention as pa
from ejk_triton._paged_attention import PagedAttentionConfig, capability, config_space, heuristic_config

ON_GPU = _env.nvidia_gpu()[0]
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")

ARRAYS = ("q", "k_pages", "v_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")


def make_batch(
    seed: int,
    *,
    q_lens: list[int],
    kv_lens: list[int],
    num_seqs: int | None = None,
    page: int = 4,
    hq: int = 4,
    hkv: int = 1,
    d: int = 16,
    dv: int | None = None,
    spare_tokens: int = 0,
    num_pages: int = 0,
    dtype: Any = jnp.float32,
) -> dict[str, Any]:
    """A random paged batch: shuffled pages, spare pages, out-of-range garbage in unused table entries.

    Sequences past ``num_seqs`` are padding; ``spare_tokens`` query rows past the last sequence
    belong to nobody; ``num_pages`` (when larger than needed) fixes the cache size.
    """
    rng = np.random.default_rng(seed)
    used = [-(-n // page) for n in kv_lens]
    pages_per_seq = max(used) + 1
    num_pages = max(sum(used) + 2, num_pages)
    order = iter(rng.permutation(num_pages))
    table = rng.integers(-5, num_pages + 5, size=(len(kv_lens), pages_per_seq))
    for s, count in enumerate(used):
        table[s, :count] = [next(order) for _ in range(count)]
    cu = np.concatenate([[0], np.cumsum(q_lens)])

    def normal(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)

    return {
        "q": normal(int(cu[-1]) + spare_tokens, hq, d),
        "k_pages": normal(num_pages, page, hkv, d),
        "v_pages": normal(num_pages, page, hkv, dv or d),
        "kv_lens": jnp.asarray(kv_lens, jnp.int32),
        "page_indices": jnp.asarray(table, jnp.int32),
        "cu_q_lens": jnp.asarray(cu, jnp.int32),
        "num_seqs": jnp.asarray(len(kv_lens) if num_seqs is None else num_seqs, jnp.int32),
    }


def arrays(batch: dict[str, Any]) -> list[Any]:
    return [batch[name] for name in ARRAYS]


def run_op(batch: dict[str, Any], cfg: PagedAttentionConfig | None = None, **options: Any) -> jax.Array:
    """Through the public op, forced onto the Triton platform."""
    return ejk.ragged_paged_attention(*arrays(batch), platform="triton", cfg=cfg, **options)


def check(batch: dict[str, Any], cfg: PagedAttentionConfig | None = None, want: Any = None,
          **options: Any) -> np.ndarray:
    """Run the op, compare with the reference (or ``want``), check unowned rows are zeros; returns the output."""
    out = run_op(batch, cfg, **options)
    if want is None:
        want = reference_ragged_paged_attention(*arrays(batch), **options)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert_close(out, want, out.dtype, what=f"{cfg} {options}")
    got = np.asarray(out, np.float32)
    cu, live = np.asarray(batch["cu_q_lens"]), int(batch["num_seqs"])
    owned = np.zeros(got.shape[0], bool)
    owned[cu[0]:cu[live]] = True
    assert not np.any(got[~owned]), "rows of no live sequence must be zeros"
    assert np.all(np.isfinite(got))
    return got


def cfg(block_q: int = 1, block_kv: int = 16, splits: int = 1, fused_merge: bool = True) -> PagedAttentionConfig:
    return PagedAttentionConfig(block_q=block_q, block_kv=block_kv, num_splits=splits, fused_merge=fused_merge)


# ----------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------

SCENARIOS: dict[str, tuple[dict[str, Any], PagedAttentionConfig | None]] = {
    # decode, split-K over the context (kv_len not a multiple of the page, 1-key contexts)
    "decode_splits": ({"q_lens": [1, 1, 1, 1, 1], "kv_lens": [9, 1, 16, 4, 23]}, cfg(splits=3)),
    "decode_splits_jax_merge": ({"q_lens": [1, 1, 1, 1], "kv_lens": [9, 1, 33, 4], "num_seqs": 3, "spare_tokens": 1},
                                cfg(splits=3, fused_merge=False)),
    "decode_heuristic": ({"q_lens": [1, 1, 1], "kv_lens": [30, 7, 12], "page": 8}, None),
    # chunked prefill: tiles of 2 tokens, several per sequence; a whole prompt (q_len == kv_len)
    "chunked_prefill": ({"q_lens": [5, 3, 8], "kv_lens": [13, 3, 20]}, cfg(block_q=2)),
    "prefill_splits_jax_merge": ({"q_lens": [7, 4], "kv_lens": [30, 4], "page": 8},
                                 cfg(block_q=4, splits=2, fused_merge=False)),
    # mixed decode and prefill, an empty sequence (q_len 0) and a sequence with an empty context
    "mixed": ({"q_lens": [1, 6, 0, 1, 4, 0], "kv_lens": [17, 6, 5, 2, 11, 0]}, cfg(block_q=4, splits=2)),
    # pages of 3 keys (not a power of two), blocks of 16 keys spanning several pages
    "odd_page": ({"q_lens": [2, 3], "kv_lens": [5, 19], "page": 3}, cfg(block_q=2)),
    # 32-key pages: one page per block of 16 keys
    "big_page": ({"q_lens": [1, 3], "kv_lens": [40, 35], "page": 32}, cfg(block_q=4, splits=2)),
    # num_seqs < S (padding sequences) and query rows past the last sequence
    "padding": ({"q_lens": [3, 1, 2, 4], "kv_lens": [7, 5, 9, 6], "num_seqs": 2, "spare_tokens": 3}, cfg(block_q=2)),
    "no_live_sequence": ({"q_lens": [2, 1], "kv_lens": [4, 5], "num_seqs": 0}, cfg(splits=2)),
    "single_key": ({"q_lens": [1], "kv_lens": [1], "page": 1}, None),
}


@needs_kernels
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenarios(scenario: str) -> None:
    shape, config = SCENARIOS[scenario]
    check(make_batch(1, **shape), config)


@needs_kernels
@pytest.mark.parametrize(
    ("window", "cap", "scale", "config"),
    [((3, 0), None, None, cfg(block_q=2)), (5, 2.0, 0.5, cfg(splits=2)), (None, 1.5, None, cfg(block_q=4, splits=2)),
     (0, None, None, cfg(block_q=2)), (18, 3.0, None, cfg(block_q=4, splits=2))],
    ids=["window", "window_cap_scale_splits", "soft_cap", "window_0", "window_over_blocks"],
)
def test_window_soft_cap_scale(window: Any, cap: Any, scale: Any, config: PagedAttentionConfig) -> None:
    batch = make_batch(2, q_lens=[1, 6, 3, 1], kv_lens=[40, 14, 3, 33], spare_tokens=2)
    check(batch, config, sliding_window=window, logits_soft_cap=cap, softmax_scale=scale)


@needs_kernels
@pytest.mark.parametrize(("hq", "hkv"), [(2, 2), (4, 2), (16, 2), (6, 2)], ids=["mha", "gqa2", "gqa8", "gqa3"])
def test_gqa(hq: int, hkv: int) -> None:
    batch = make_batch(3, q_lens=[1, 4, 2], kv_lens=[21, 7, 12], hq=hq, hkv=hkv, d=8)
    check(batch, cfg(block_q=2, splits=2))


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=["f32", "f16", "bf16"])
def test_dtypes_and_value_head_dim(dtype: Any) -> None:
    batch = make_batch(4, q_lens=[1, 5, 2], kv_lens=[11, 8, 17], d=24, dv=12, dtype=dtype, spare_tokens=1)
    out = check(batch, cfg(block_q=2, splits=2), logits_soft_cap=3.0)
    assert out.shape == (9, 4, 12)


@needs_kernels
def test_random_batches() -> None:
    rng = np.random.default_rng(11)
    for seed in range(3):
        seqs = int(rng.integers(1, 5))
        kv_lens = [int(x) for x in rng.integers(0, 40, size=seqs)]
        q_lens = [int(rng.integers(0, n + 1)) for n in kv_lens]
        batch = make_batch(seed, q_lens=q_lens, kv_lens=kv_lens, page=int(rng.choice([2, 5, 16])),
                           num_seqs=int(rng.integers(0, seqs + 1)), spare_tokens=int(rng.integers(0, 3)))
        config = cfg(block_q=int(rng.choice([1, 2, 4])), block_kv=int(rng.choice([16, 32])),
                     splits=int(rng.integers(1, 4)))
        window = [None, int(rng.integers(0, 20))][int(rng.integers(0, 2))]
        check(batch, config, sliding_window=window)


@needs_kernels
def test_unseen_nan_does_not_leak_and_seen_nan_propagates() -> None:
    batch = make_batch(5, q_lens=[1, 3], kv_lens=[6, 11], page=4, hkv=2, num_pages=8)
    table, lens = np.asarray(batch["page_indices"]), np.asarray(batch["kv_lens"])
    used = {int(table[s, j]) for s in range(2) for j in range(-(-int(lens[s]) // 4))}
    k, v = np.array(batch["k_pages"]), np.array(batch["v_pages"])
    for page in set(range(k.shape[0])) - used:  # pages nobody uses
        k[page], v[page] = np.nan, np.nan
    k[table[0, 1], 2:], v[table[0, 1], 2:] = np.nan, np.nan  # the tail past sequence 0's 6 keys
    v[table[1, 0], 1] = np.nan  # key 1 of sequence 1: outside the window of its last rows' tile (rows 9, 10)
    poisoned = {**batch, "k_pages": jnp.asarray(k), "v_pages": jnp.asarray(v)}
    for config in (cfg(splits=2), cfg(block_q=4)):
        out = np.asarray(run_op(poisoned, config, sliding_window=4))
        assert np.all(np.isfinite(out)), config
        assert_close(out, reference_ragged_paged_attention(*arrays(batch), sliding_window=4), jnp.float32)
    q = np.array(batch["q"])
    q[2, 1] = np.nan  # row 2 (sequence 1), q head 1
    out = np.asarray(run_op({**batch, "q": jnp.asarray(q)}, cfg(block_q=4, splits=2)))
    assert np.all(np.isnan(out[2, 1])) and np.isfinite(np.delete(out.reshape(-1, 16), 2 * 4 + 1, axis=0)).all()
    k = np.array(batch["k_pages"])
    k[table[1, 2], 1, 0] = np.nan  # key 9 of sequence 1, kv head 0: rows 2 and 3 (positions 9, 10) see it
    for merge in (True, False):
        out = np.asarray(run_op({**batch, "k_pages": jnp.asarray(k)}, cfg(splits=3, fused_merge=merge)))
        assert np.isnan(out[2:4, :2]).all() and np.isfinite(out[2:4, 2:]).all() and np.isfinite(out[:2]).all()


@needs_kernels
def test_rows_that_see_no_key_are_zeros() -> None:
    """Called directly (bypassing the op's checks): q_len > kv_len puts early queries before the context."""
    batch = make_batch(6, q_lens=[4, 1], kv_lens=[2, 3])
    out = np.asarray(pa.ragged_paged_attention(*arrays(batch), softmax_scale=0.25, sliding_window=None,
                                               logits_soft_cap=None, cfg=cfg(block_q=2, splits=2)))
    assert not np.any(out[:2]), "queries at negative positions see nothing"
    assert np.all(np.abs(out[2:]).sum(axis=(1, 2)) > 0)
    assert_close(out, reference_ragged_paged_attention(*arrays(batch), softmax_scale=0.25), jnp.float32)


@needs_kernels
def test_jit_with_traced_lengths_and_num_seqs() -> None:
    traces = []

    @jax.jit
    def run(*args: jax.Array) -> jax.Array:
        traces.append(1)
        return ejk.ragged_paged_attention(*args, sliding_window=6, platform="triton", cfg=cfg(block_q=2, splits=2))

    shape: dict[str, Any] = {"page": 4, "num_pages": 12}  # same shapes for all three: one trace
    batches = [
        make_batch(7, q_lens=[1, 3, 2], kv_lens=[9, 3, 14], **shape),
        make_batch(8, q_lens=[2, 2, 2], kv_lens=[12, 5, 14], num_seqs=2, **shape),
        make_batch(9, q_lens=[6, 0, 0], kv_lens=[14, 1, 1], num_seqs=1, **shape),
    ]
    for batch in batches:
        want = reference_ragged_paged_attention(*arrays(batch), sliding_window=6)
        assert_close(run(*arrays(batch)), want, jnp.float32)
    assert len(traces) == 1


@needs_kernels
def test_vmap_over_layers() -> None:
    layers = [make_batch(seed, q_lens=[1, 3], kv_lens=[7, 10]) for seed in range(2)]
    shared = arrays(layers[0])[3:]  # one page table and one set of lengths for every layer
    stacked = [jnp.stack([layer[name] for layer in layers]) for name in ARRAYS[:3]]

    def attend(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array) -> jax.Array:
        return ejk.ragged_paged_attention(q, k_pages, v_pages, *shared, logits_soft_cap=2.0, platform="triton",
                                          cfg=cfg(block_q=2))

    out = jax.jit(jax.vmap(attend))(*stacked)
    for i, layer in enumerate(layers):
        want = reference_ragged_paged_attention(*arrays(layer)[:3], *shared, logits_soft_cap=2.0)
        assert_close(out[i], want, jnp.float32)


@needs_kernels
def test_public_op_conformance() -> None:
    assert check_op("ragged_paged_attention", "triton") == 6


# ----------------------------------------------------------------------------------------------
# Capability gate and configs
# ----------------------------------------------------------------------------------------------


def _sds(shape: tuple[int, ...], dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def abstract(tokens: int, seqs: int, ctx: int, page: int = 64, hq: int = 32, hkv: int = 8, d: int = 128,
             dtype: Any = jnp.bfloat16) -> tuple[Any, ...]:
    pages_per_seq = -(-ctx // page)
    kv = _sds((seqs * pages_per_seq, page, hkv, d), dtype)
    i32 = jnp.int32
    return (_sds((tokens, hq, d), dtype), kv, kv, _sds((seqs,), i32), _sds((seqs, pages_per_seq), i32),
            _sds((seqs + 1,), i32), _sds((), i32))


def test_capability_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    assert capability(*abstract(8, 8, 2048)) is None
    assert capability(*abstract(64, 4, 100, page=3, hq=12, hkv=4, d=256)) is None
    assert capability(*abstract(8, 8, 256, dtype=jnp.float32)) is None
    assert capability(*abstract(8, 8, 256, d=512)) == "head_dim 512 not supported (at most 256)"
    assert "head_dim 256 not supported in float32" in (capability(*abstract(8, 8, 256, d=256, dtype=jnp.float32))
                                                      or "")
    assert capability(*abstract(8, 8, 256, dtype=jnp.float64)) == (
        "float64 not supported (bfloat16, float16 and float32 only)")
    q, k, _v, *rest = abstract(8, 8, 256)
    assert "one dtype" in (capability(q, k, _sds(k.shape, jnp.float16), *rest) or "")
    assert "512 q heads per kv head" in (capability(*abstract(8, 8, 256, hq=512, hkv=1)) or "")
    assert "5000 sequences not supported" in (capability(*abstract(5000, 5000, 64)) or "")
    if not ON_GPU:
        ejk.kernel_registry.list_algorithms()  # plugins load (and register for the CPU) while the variable is set
        monkeypatch.delenv("EJK_TRITON_INTERPRET")
        assert (capability(*abstract(8, 8, 256)) or "").startswith("needs an NVIDIA GPU")


@pytest.mark.parametrize(("field", "bad"), [("block_q", 0), ("block_q", 3), ("block_kv", 8), ("block_kv", True),
                                            ("num_splits", 0), ("num_splits", 65), ("num_warps", 3),
                                            ("num_stages", 0), ("block_kv", 64.0), ("fused_merge", 1)])
def test_config_validation(field: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=f"PagedAttentionConfig.{field}"):
        PagedAttentionConfig(**{field: bad})


def test_max_tiles_bounds_every_batch() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        seqs, block_q = int(rng.integers(1, 9)), int(rng.choice([1, 2, 4, 8]))
        q_lens = rng.integers(0, 12, size=seqs)
        tokens = int(q_lens.sum()) + int(rng.integers(0, 3))
        tiles = int(sum(-(-int(n) // block_q) for n in q_lens))
        assert tiles <= pa.max_tiles(max(tokens, 1), seqs, block_q)


def test_heuristic_on_gpu_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_env, "interpret_mode", lambda: False)  # the GPU rules, whatever this machine is
    monkeypatch.setattr(pa, "_sm_count", lambda: 132)
    monkeypatch.setattr(pa, "_smem_limit", lambda: 227 * 1024)
    decode = heuristic_config(*abstract(8, 8, 2048))
    assert (decode.block_q, decode.block_kv, decode.num_warps, decode.num_stages) == (1, 64, 4, 3)
    assert not decode.fused_merge  # the merge in JAX: no memset of arrival counters before the launch
    assert decode.num_splits == 4  # 2048 keys: 4 splits of 8 steps of 64 (256 programs, within one wave)
    assert heuristic_config(*abstract(16, 16, 2048)).num_splits == 3  # 384 programs: one wave of 3 per SM
    long_decode = heuristic_config(*abstract(8, 8, 8192))
    assert long_decode.num_stages == 3 and long_decode.num_splits == 6  # 384 programs
    assert heuristic_config(*abstract(32, 32, 16384)).num_splits == 1  # 256 programs already
    assert heuristic_config(*abstract(8, 8, 128)).num_splits == 1  # 128 keys: too short to split
    prefill = heuristic_config(*abstract(1024, 4, 2048))
    assert prefill.block_q == 32 and prefill.num_splits == 1  # 32 tokens x 4 q heads = 128 rows
    assert heuristic_config(*abstract(64, 8, 2048, hq=8, hkv=8)).block_q == 8  # the average query length
    for args in (abstract(8, 8, 4096), abstract(2048, 16, 4096, page=16), abstract(8, 4, 4096, d=256),
                 abstract(8, 8, 4096, dtype=jnp.float32)):
        space = config_space(*args)
        assert space[0] == heuristic_config(*args)
        assert 8 <= len(space) <= 16 and len(set(space)) == len(space)
        assert all(pa.smem_bytes(c, args[0], args[2]) <= 227 * 1024 for c in space)


def test_interpreter_heuristic_uses_small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EJK_TRITON_INTERPRET", "1")
    if ON_GPU:
        pytest.skip("on a GPU the GPU rules apply")
    args = abstract(8, 8, 2048)
    assert heuristic_config(*args).block_kv == 16
    assert len(config_space(*args)) == 2


_AOT_SCRIPT = """
import json, jax, jax.numpy as jnp
from ejk_triton._aot import compile_ragged_paged_attention as compile_paged
sds, i32 = jax.ShapeDtypeStruct, jnp.int32
def shapes(tokens, seqs, ctx, page, hq=32, hkv=8, d=128, dtype=jnp.bfloat16):
    kv = sds((seqs * (ctx // page), page, hkv, d), dtype)
    return sds((tokens, hq, d), dtype), kv, kv, sds((seqs, ctx // page), i32)
report = {"decode": compile_paged(*shapes(8, 8, 2048, 64)),
          "decode page 16, window, cap": compile_paged(*shapes(16, 16, 4096, 16), sliding_window=(512, 0),
                                                       logits_soft_cap=30.0),
          "prefill, float16, d256": compile_paged(*shapes(1024, 4, 2048, 32, hq=16, hkv=4, d=256,
                                                          dtype=jnp.float16), sliding_window=(256, 0))}
print(json.dumps(report))
"""


def test_kernel_compiles_for_sm90_without_a_gpu(compile_report: Any) -> None:
    # The interpreter runs the kernel's Python; this compiles it as a GPU would (PTX, then a cubin with
    # the ptxas Triton ships), in a process without the interpreter, and checks its shared memory.
    report = compile_report(_AOT_SCRIPT)
    assert len(report) == 3
    for variant, info in report.items():
        assert 0 < info["shared"] <= 227 * 1024, f"{variant}: {info}"


# ----------------------------------------------------------------------------------------------
# GPU: real sizes, compiled
# ----------------------------------------------------------------------------------------------


def _gpu_batch(seed: int, q_lens: list[int], kv_lens: list[int], page: int, dtype: Any = jnp.bfloat16,
               hq: int = 32, hkv: int = 8, d: int = 128) -> dict[str, Any]:
    return make_batch(seed, q_lens=q_lens, kv_lens=kv_lens, page=page, hq=hq, hkv=hkv, d=d, dtype=dtype,
                      spare_tokens=3, num_seqs=len(kv_lens) - 1)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("page", [16, 64])
def test_gpu_decode_and_mixed(page: int) -> None:
    decode = _gpu_batch(0, [1] * 9, [4096, 1, 777, 2048, 65, 3000, 4000, 64, 100], page)
    check(decode)
    check(decode, sliding_window=1000, logits_soft_cap=30.0)
    mixed = _gpu_batch(1, [1, 300, 1, 400, 17, 5], [2000, 300, 4096, 3500, 17, 900], page, dtype=jnp.float16)
    check(mixed)
    check(mixed, sliding_window=256)
    f32 = _gpu_batch(2, [1, 64, 1, 1], [1500, 700, 33, 1], page, dtype=jnp.float32, hq=8, hkv=2)
    check(f32, logits_soft_cap=10.0)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
def test_gpu_config_space_compiles_and_matches() -> None:
    for batch in (_gpu_batch(3, [1] * 9, [4096, 100, 2000, 3000, 1, 4096, 2500, 64, 9], 64),
                  _gpu_batch(4, [200, 1, 512, 64, 3], [1024, 2048, 512, 4000, 3], 32)):
        space = config_space(*arrays(batch))
        assert len(space) >= 8
        want = reference_ragged_paged_attention(*arrays(batch), sliding_window=700)
        for config in space:
            check(batch, config, want, sliding_window=700)
    assert ejk.ragged_paged_attention(*arrays(batch), platform="auto").shape == batch["q"].shape
    spec = ejk.kernel_registry.get_spec("ragged_paged_attention", platform="triton")
    assert spec.platform == "triton" and attrs.has(spec.cfg_type)
