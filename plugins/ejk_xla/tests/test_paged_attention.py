"""The XLA ragged paged attention against the per-sequence reference, its config and checks."""

from __future__ import annotations

import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ejk.ops.validate import check_ragged_paged_attention_args
from ejk.testing import assert_close, reference_ragged_paged_attention
from ejk_xla._paged_attention import PagedAttentionConfig, config_space, heuristic_config, ragged_paged_attention

pytestmark = pytest.mark.filterwarnings("error")

#: ejk.testing's comparison with the paged rows of its tolerance table, shapes and dtypes included.
close = functools.partial(assert_close, kind="paged", strict=True)
ARRAYS = ("q", "k_pages", "v_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
OPTIONS = ("softmax_scale", "sliding_window", "logits_soft_cap")


def make_batch(
    rng: np.random.Generator,
    *,
    q_lens: list[int],
    kv_lens: list[int],
    num_seqs: int | None = None,
    page: int = 4,
    hq: int = 4,
    hkv: int = 2,
    d: int = 16,
    dv: int | None = None,
    spare_pages: int = 3,
    num_pages: int = 0,
    spare_tokens: int = 0,
    share_first_page: bool = False,
    dtype: Any = jnp.float32,
) -> dict[str, Any]:
    """A random paged batch: shuffled pages, unused pages, garbage in unused table entries.

    Sequences past ``num_seqs`` (padding) get random lengths and tables; ``spare_tokens``
    query rows past the last sequence belong to nobody. ``num_pages`` (if larger than
    needed) fixes the cache size, so that batches of different lengths share shapes.
    """
    used = [-(-n // page) for n in kv_lens]
    pages_per_seq = max(used) + 1
    num_pages = max(sum(used) + spare_pages, num_pages)
    order = iter(rng.permutation(num_pages))
    table = rng.integers(-3, num_pages + 3, size=(len(kv_lens), pages_per_seq))  # garbage where unused
    for s, count in enumerate(used):
        table[s, :count] = [next(order) for _ in range(count)]
    if share_first_page:  # a shared prefix page, as with prefix caching
        table[1, 0] = table[0, 0]
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    return {
        "q": jnp.asarray(rng.standard_normal((int(cu[-1]) + spare_tokens, hq, d)), dtype),
        "k_pages": jnp.asarray(rng.standard_normal((num_pages, page, hkv, d)), dtype),
        "v_pages": jnp.asarray(rng.standard_normal((num_pages, page, hkv, dv or d)), dtype),
        "kv_lens": jnp.asarray(kv_lens, jnp.int32),
        "page_indices": jnp.asarray(table, jnp.int32),
        "cu_q_lens": jnp.asarray(cu, jnp.int32),
        "num_seqs": jnp.asarray(len(kv_lens) if num_seqs is None else num_seqs, jnp.int32),
    }


def run_impl(batch: dict[str, Any], cfg: PagedAttentionConfig | None = None, **options: Any) -> jax.Array:
    """The implementation, with checked and normalised options."""
    arrays = [batch[name] for name in ARRAYS]
    user: dict[str, Any] = {name: options.get(name) for name in OPTIONS}
    scale, window = check_ragged_paged_attention_args(*arrays, **user)
    return ragged_paged_attention(
        *arrays, softmax_scale=scale, sliding_window=window, logits_soft_cap=user["logits_soft_cap"], cfg=cfg
    )


def run_both(
    batch: dict[str, Any], cfg: PagedAttentionConfig | None = None, **options: Any
) -> tuple[jax.Array, jax.Array]:
    """The implementation (with checked, normalised options) and the reference (user options)."""
    arrays = [batch[name] for name in ARRAYS]
    user: dict[str, Any] = {name: options.get(name) for name in OPTIONS}
    return run_impl(batch, cfg, **options), reference_ragged_paged_attention(*arrays, **user)


def owned_rows(batch: dict[str, Any]) -> np.ndarray:
    """Boolean mask of the query rows a live sequence owns."""
    cu, live = np.asarray(batch["cu_q_lens"]), int(batch["num_seqs"])
    rows = np.zeros(batch["q"].shape[0], bool)
    rows[cu[0]:cu[live]] = True
    return rows


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


PATHS = {
    "per_token": PagedAttentionConfig(pages_per_block=2),
    # Tiles of 3 rows: several tiles per sequence, and end-of-T slices moved back over other rows.
    "tiled": PagedAttentionConfig(pages_per_block=2, q_block=3),
    "one_tile": PagedAttentionConfig(pages_per_block=2, q_block=64),  # more rows than any sequence (and T)
}


@pytest.fixture(params=list(PATHS))
def cfg(request: pytest.FixtureRequest) -> PagedAttentionConfig:
    """Each algorithm: per token, and sequence tiled with small and large tiles."""
    return PATHS[request.param]


# -- values ---------------------------------------------------------------------------------------


SCENARIOS: dict[str, dict[str, Any]] = {
    "decode": {"q_lens": [1, 1, 1, 1, 1], "kv_lens": [9, 1, 16, 4, 23]},
    "chunked_prefill": {"q_lens": [5, 3, 8], "kv_lens": [13, 3, 20]},
    "mixed": {"q_lens": [1, 6, 1, 4], "kv_lens": [17, 6, 2, 11]},
    "short_page_tails": {"q_lens": [2, 3], "kv_lens": [5, 7], "page": 3},
    "padding_sequences": {"q_lens": [3, 1, 2, 4], "kv_lens": [7, 5, 9, 6], "num_seqs": 2, "spare_tokens": 3},
    "no_live_sequence": {"q_lens": [2, 1], "kv_lens": [4, 5], "num_seqs": 0},
    "shared_page": {"q_lens": [2, 2], "kv_lens": [6, 9], "share_first_page": True},
    "single_token": {"q_lens": [1], "kv_lens": [1], "page": 1},
}


@pytest.mark.parametrize("path", [*PATHS, "heuristic"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenarios(rng: np.random.Generator, scenario: str, path: str) -> None:
    batch = make_batch(rng, **SCENARIOS[scenario])
    out, ref = run_both(batch, PATHS.get(path))
    close(out, ref, jnp.float32)
    assert not np.any(np.asarray(out)[~owned_rows(batch)]), "rows of no live sequence must be zeros"
    assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize(
    ("window", "cap", "scale"),
    [((3, 0), None, None), (5, None, 0.5), (None, 1.5, None), ((4, 7), 2.0, 0.9), (0, None, None)],
    ids=["window", "int_window", "soft_cap", "window_right_ignored_cap", "window_0"],
)
def test_window_soft_cap_scale(
    rng: np.random.Generator, cfg: PagedAttentionConfig, window: Any, cap: Any, scale: Any
) -> None:
    batch = make_batch(rng, q_lens=[1, 6, 3], kv_lens=[19, 14, 3], spare_tokens=2)
    options = {"sliding_window": window, "logits_soft_cap": cap, "softmax_scale": scale}
    ref = reference_ragged_paged_attention(*[batch[name] for name in ARRAYS], **options)
    for pages_per_block in (1, 4):  # one page per block; several pages and a padded table
        close(run_impl(batch, attrs.evolve(cfg, pages_per_block=pages_per_block), **options), ref, jnp.float32)


@pytest.mark.parametrize(("hq", "hkv"), [(2, 2), (4, 2), (8, 1), (16, 2)], ids=["mha", "gqa2", "mqa8", "gqa8"])
def test_gqa(rng: np.random.Generator, cfg: PagedAttentionConfig, hq: int, hkv: int) -> None:
    batch = make_batch(rng, q_lens=[1, 4, 2], kv_lens=[10, 7, 12], hq=hq, hkv=hkv, d=8)
    close(*run_both(batch, cfg), jnp.float32)


def test_value_head_dim_differs(rng: np.random.Generator, cfg: PagedAttentionConfig) -> None:
    batch = make_batch(rng, q_lens=[2, 1], kv_lens=[6, 9], d=8, dv=12)
    out, ref = run_both(batch, cfg)
    assert out.shape == (3, 4, 12)
    close(out, ref, jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=["f32", "f16", "bf16"])
def test_dtypes(rng: np.random.Generator, cfg: PagedAttentionConfig, dtype: Any) -> None:
    batch = make_batch(rng, q_lens=[1, 5, 2], kv_lens=[11, 8, 17], dtype=dtype, spare_tokens=1)
    out, ref = run_both(batch, cfg, logits_soft_cap=3.0)
    assert out.dtype == dtype
    close(out, ref, dtype)


def test_random_batches(rng: np.random.Generator) -> None:
    for _ in range(4):
        seqs = int(rng.integers(1, 6))
        kv_lens = [int(x) for x in rng.integers(1, 30, size=seqs)]
        q_lens = [int(rng.integers(0, n + 1)) for n in kv_lens]
        batch = make_batch(rng, q_lens=q_lens, kv_lens=kv_lens, page=int(rng.integers(1, 6)),
                           num_seqs=int(rng.integers(0, seqs + 1)), spare_tokens=int(rng.integers(0, 3)))
        q_block = [None, int(rng.integers(1, 7))][int(rng.integers(0, 2))]
        cfg = PagedAttentionConfig(pages_per_block=int(rng.integers(1, 5)), q_block=q_block)
        close(*run_both(batch, cfg, sliding_window=int(rng.integers(0, 12))), jnp.float32)


def test_unused_slots_cannot_leak(rng: np.random.Generator, cfg: PagedAttentionConfig) -> None:
    """NaN in unused pages and in the unused tail of a partly filled page stays out."""
    batch = make_batch(rng, q_lens=[2, 1], kv_lens=[5, 6], page=4, spare_pages=2)
    table, lens = np.asarray(batch["page_indices"]), np.asarray(batch["kv_lens"])
    used = {int(table[s, j]) for s in range(2) for j in range(-(-int(lens[s]) // 4))}
    poisoned = batch["k_pages"], batch["v_pages"]
    for page in set(range(batch["k_pages"].shape[0])) - used:
        poisoned = tuple(x.at[page].set(jnp.nan) for x in poisoned)
    last = int(table[0, 1])  # sequence 0 uses slot 0 of its second page only
    poisoned = tuple(x.at[last, 1:].set(jnp.nan) for x in poisoned)
    clean_out, _ = run_both(batch, cfg)
    out, _ = run_both({**batch, "k_pages": poisoned[0], "v_pages": poisoned[1]}, cfg)
    assert np.all(np.isfinite(np.asarray(out)))
    close(out, clean_out, jnp.float32)


def test_rows_that_see_no_key_are_zeros(rng: np.random.Generator, cfg: PagedAttentionConfig) -> None:
    """Called directly (bypassing the checks): q_len > kv_len puts early queries before the context."""
    batch = make_batch(rng, q_lens=[4, 1], kv_lens=[2, 3])
    arrays = [batch[name] for name in ARRAYS]
    out = np.asarray(ragged_paged_attention(*arrays, softmax_scale=0.25, sliding_window=None, logits_soft_cap=None,
                                            cfg=cfg))
    assert not np.any(out[:2]), "queries at negative positions see nothing"
    assert np.all(np.abs(out[2:]).sum(axis=(1, 2)) > 0)
    close(jnp.asarray(out), reference_ragged_paged_attention(*arrays, softmax_scale=0.25), jnp.float32)


# -- composition ----------------------------------------------------------------------------------


def test_jit_with_traced_lengths_and_num_seqs(rng: np.random.Generator, cfg: PagedAttentionConfig) -> None:
    traces = []

    @jax.jit
    def run(*arrays: jax.Array) -> jax.Array:
        traces.append(1)
        return ragged_paged_attention(*arrays, softmax_scale=0.3, sliding_window=(6, 0), logits_soft_cap=None,
                                      cfg=cfg)

    shape: dict[str, Any] = {"page": 4, "num_pages": 12}  # same shapes for all three: one trace
    batches = [
        make_batch(rng, q_lens=[1, 3, 2], kv_lens=[9, 3, 14], **shape),
        make_batch(rng, q_lens=[2, 2, 2], kv_lens=[12, 5, 14], num_seqs=2, **shape),
        make_batch(rng, q_lens=[6, 0, 0], kv_lens=[14, 1, 1], num_seqs=1, **shape),
    ]
    for batch in batches:
        arrays = [batch[name] for name in ARRAYS]
        ref = reference_ragged_paged_attention(*arrays, softmax_scale=0.3, sliding_window=6)
        close(run(*arrays), ref, jnp.float32)
    assert len(traces) == 1


def test_vmap_over_layers(cfg: PagedAttentionConfig) -> None:
    layers = [make_batch(np.random.default_rng(seed), q_lens=[1, 3], kv_lens=[7, 10]) for seed in range(3)]
    shared = layers[0]  # one page table and one set of lengths for every layer
    stacked = {name: jnp.stack([layer[name] for layer in layers]) for name in ("q", "k_pages", "v_pages")}

    def attend(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array) -> jax.Array:
        rest = [shared[name] for name in ARRAYS[3:]]
        return ragged_paged_attention(q, k_pages, v_pages, *rest, softmax_scale=0.25, sliding_window=None,
                                      logits_soft_cap=2.0, cfg=cfg)

    out = jax.jit(jax.vmap(attend))(stacked["q"], stacked["k_pages"], stacked["v_pages"])
    for i, layer in enumerate(layers):
        arrays = [layer[name] for name in ARRAYS[:3]] + [shared[name] for name in ARRAYS[3:]]
        close(out[i], reference_ragged_paged_attention(*arrays, softmax_scale=0.25, logits_soft_cap=2.0), jnp.float32)


def test_vmap_over_whole_problems(cfg: PagedAttentionConfig) -> None:
    """Lengths, tables and num_seqs batched too: the loops run to the longest problem's bounds."""
    shape: dict[str, Any] = {"page": 4, "num_pages": 12}
    problems = [
        make_batch(np.random.default_rng(1), q_lens=[1, 5], kv_lens=[7, 10], **shape),
        make_batch(np.random.default_rng(2), q_lens=[4, 2], kv_lens=[12, 5], num_seqs=1, **shape),
    ]
    stacked = [jnp.stack([problem[name] for problem in problems]) for name in ARRAYS]

    def attend(*arrays: jax.Array) -> jax.Array:
        return ragged_paged_attention(*arrays, softmax_scale=0.25, sliding_window=(5, 0), logits_soft_cap=None,
                                      cfg=cfg)

    out = jax.jit(jax.vmap(attend))(*stacked)
    for i, problem in enumerate(problems):
        arrays = [problem[name] for name in ARRAYS]
        close(out[i], reference_ragged_paged_attention(*arrays, softmax_scale=0.25, sliding_window=5), jnp.float32)


def test_shard_map_over_heads(rng: np.random.Generator, cfg: PagedAttentionConfig) -> None:
    """Inside ``shard_map`` the loop carries must vary along the mesh axis like the heads do."""
    batch = make_batch(rng, q_lens=[2, 5], kv_lens=[9, 11], spare_tokens=1)
    arrays = [batch[name] for name in ARRAYS]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("heads",))
    heads, pages, whole = jax.P(None, "heads", None), jax.P(None, None, "heads", None), jax.P()

    def local(*arrays: jax.Array) -> jax.Array:
        return ragged_paged_attention(*arrays, softmax_scale=0.25, sliding_window=None, logits_soft_cap=None,
                                      cfg=cfg)

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(heads, pages, pages) + (whole,) * 4, out_specs=heads)
    close(jax.jit(sharded)(*arrays), reference_ragged_paged_attention(*arrays, softmax_scale=0.25), jnp.float32)


def test_tile_slice_moved_back_leaves_other_rows(rng: np.random.Generator) -> None:
    """A tile at the end of ``T`` reads an earlier slice; rows of other sequences keep their values."""
    batch = make_batch(rng, q_lens=[5, 1], kv_lens=[9, 4], spare_tokens=0)
    for q_block in (2, 4, 6):
        out, ref = run_both(batch, PagedAttentionConfig(pages_per_block=1, q_block=q_block))
        close(out, ref, jnp.float32)


# -- config ---------------------------------------------------------------------------------------


def test_config_validation() -> None:
    for bad in (0, -1, 2.0, False, None):
        with pytest.raises(ValueError, match="pages_per_block"):
            PagedAttentionConfig(pages_per_block=bad)  # type: ignore[arg-type]
    bad_blocks: tuple[Any, ...] = (0, -3, 4.0, True, "8")
    for bad in bad_blocks:
        with pytest.raises(ValueError, match=r"q_block is .* but needs None or a positive int"):
            PagedAttentionConfig(q_block=bad)
    assert PagedAttentionConfig() == PagedAttentionConfig(pages_per_block=8, q_block=None)
    cfg = PagedAttentionConfig(pages_per_block=4, q_block=16)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.pages_per_block = 2  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.q_block = 2  # type: ignore[misc]
    assert hash(cfg) == hash(PagedAttentionConfig(pages_per_block=4, q_block=16))
    assert cfg != PagedAttentionConfig(pages_per_block=4)


def _abstract_args(
    tokens: int, pages_per_seq: int, page: int = 16, hkv: int = 8, d: int = 128, seqs: int = 8
) -> tuple[Any, ...]:
    sds = jax.ShapeDtypeStruct
    return (sds((tokens, 4 * hkv, d), jnp.bfloat16), sds((1024, page, hkv, d), jnp.bfloat16),
            sds((1024, page, hkv, d), jnp.bfloat16), sds((seqs,), jnp.int32), sds((seqs, pages_per_seq), jnp.int32),
            sds((seqs + 1,), jnp.int32), sds((), jnp.int32))


def _step_floats(cfg: PagedAttentionConfig, tokens: int, page: int = 16, hkv: int = 8, d: int = 128) -> int:
    """Floats live per loop step, as the config docstring states."""
    kv = cfg.pages_per_block * page * hkv * 2 * d
    if cfg.q_block is None:
        return tokens * kv
    return cfg.q_block * 4 * hkv * cfg.pages_per_block * page + kv


@pytest.mark.parametrize(
    ("tokens", "pages_per_seq", "seqs"),
    [(8, 1, 8), (8, 3, 8), (64, 128, 8), (8192, 128, 8), (1024, 32, 4), (4096, 64, 4096), (100, 8, 1)],
)
def test_config_space_and_heuristic(tokens: int, pages_per_seq: int, seqs: int) -> None:
    args = _abstract_args(tokens, pages_per_seq, seqs=seqs)
    space = config_space(*args)
    assert 2 <= len(space) <= 10
    assert len(set(space)) == len(space)
    assert all(1 <= c.pages_per_block <= pages_per_seq for c in space)
    assert {c.q_block is None for c in space} == {True, False}, "both algorithms are candidates"
    assert all(c.q_block is None or 1 <= c.q_block <= tokens for c in space)
    smallest = {c.q_block: min(d.pages_per_block for d in space if d.q_block == c.q_block) for c in space}
    for c in space:  # within the budget, or the smallest block of its kind
        assert 4 * _step_floats(c, tokens) <= 64 * 2**20 or c.pages_per_block == smallest[c.q_block]
    assert heuristic_config(*args) in space


@pytest.mark.parametrize(
    ("tokens", "seqs", "q_block"),
    [(8, 8, None), (32, 8, None), (33, 8, 8), (64, 8, 8), (1024, 4, 256), (8192, 8, 256), (100, 1, 100),
     (4096, 64, 64), (4096, 48, 128)],
)
def test_heuristic_path_and_tile(tokens: int, seqs: int, q_block: int | None) -> None:
    """Per token up to 4 queries per sequence on average; else the next power of two (<= 256, <= T)."""
    assert heuristic_config(*_abstract_args(tokens, 64, seqs=seqs)).q_block == q_block


def test_heuristic_blocks() -> None:
    """About 512 kv positions per block; per token, fewer when many tokens gather at once."""
    decode_few = heuristic_config(*_abstract_args(8, 128))
    decode_many = heuristic_config(*_abstract_args(8192, 128, seqs=4096))
    prefill = heuristic_config(*_abstract_args(1024, 128, seqs=4))
    assert decode_few == PagedAttentionConfig(pages_per_block=32)
    assert decode_many.q_block is None
    assert decode_many.pages_per_block < decode_few.pages_per_block
    assert prefill == PagedAttentionConfig(pages_per_block=32, q_block=256)


@pytest.mark.parametrize(
    ("q_lens", "kv_lens"), [([1, 4], [23, 9]), ([7, 12], [20, 12])], ids=["decode_like", "prefill_like"]
)
def test_every_config_in_space_is_correct(rng: np.random.Generator, q_lens: list[int], kv_lens: list[int]) -> None:
    batch = make_batch(rng, q_lens=q_lens, kv_lens=kv_lens, page=2)
    arrays = [batch[name] for name in ARRAYS]
    space = config_space(*arrays)
    assert len(space) >= 5
    assert heuristic_config(*arrays) in space
    for cfg in space:
        close(*run_both(batch, cfg), jnp.float32)


# -- check_ragged_paged_attention_args -----------------------------------------------------------


def _valid() -> dict[str, Any]:
    return make_batch(np.random.default_rng(0), q_lens=[2, 1, 3], kv_lens=[5, 8, 3], page=4, spare_tokens=1)


def _check(**overrides: Any) -> tuple[float, tuple[int, int] | None]:
    args = {**_valid(), **{name: None for name in OPTIONS}, **overrides}
    return check_ragged_paged_attention_args(*[args[name] for name in ARRAYS], **{n: args[n] for n in OPTIONS})


def test_check_resolves_scale_and_window() -> None:
    scale, window = _check()
    assert scale == pytest.approx(1 / 4)  # D = 16
    assert window is None
    assert _check(softmax_scale=0.5, sliding_window=3) == (0.5, (3, 0))
    assert _check(sliding_window=(7, 2))[1] == (7, 0)
    assert _check(sliding_window=[0, 0])[1] == (0, 0)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"q": jnp.zeros((6, 4))}, r"q has shape \(6, 4\) but needs \[T, Hq, D\]"),
        ({"k_pages": jnp.zeros((10, 4, 2, 8))}, r"k_pages has shape \(10, 4, 2, 8\) but needs \[P, page, Hkv, D=16\]"),
        ({"v_pages": jnp.zeros((10, 4, 1, 16))}, r"v_pages has shape \(10, 4, 1, 16\) but needs \[P=\d+, page=4"),
        ({"q": jnp.zeros((6, 3, 16))}, r"q has 3 heads .* multiple of the 2 kv heads"),
        ({"kv_lens": jnp.zeros((3, 1), jnp.int32)}, r"kv_lens has shape \(3, 1\) but needs \[S\]"),
        ({"page_indices": jnp.zeros((2, 3), jnp.int32)}, r"page_indices has shape \(2, 3\) but needs \[S=3, "),
        ({"cu_q_lens": jnp.zeros((3,), jnp.int32)}, r"cu_q_lens has shape \(3,\) but needs \[S\+1=4\]"),
        ({"num_seqs": jnp.zeros((2,), jnp.int32)}, r"num_seqs has shape \(2,\) but needs a scalar"),
        ({"q": jnp.zeros((6, 4, 16), jnp.int32)}, r"q has dtype int32 but needs a floating dtype"),
        ({"kv_lens": jnp.zeros((3,), jnp.float32)}, r"kv_lens has dtype float32 but needs an integer dtype"),
        ({"cu_q_lens": None}, r"cu_q_lens is None"),
        ({"softmax_scale": -1.0}, r"softmax_scale is -1.0 but needs a finite number > 0"),
        ({"softmax_scale": "big"}, r"softmax_scale is 'big'"),
        ({"logits_soft_cap": 0.0}, r"logits_soft_cap is 0.0 but needs a finite number > 0"),
        ({"logits_soft_cap": float("inf")}, r"logits_soft_cap is inf"),
        ({"sliding_window": -1}, r"sliding_window is -1 but needs"),
        ({"sliding_window": (1, 2, 3)}, r"sliding_window is \(1, 2, 3\)"),
        ({"sliding_window": 2.5}, r"sliding_window is 2.5"),
        ({"sliding_window": True}, r"sliding_window is True"),
    ],
)
def test_check_shape_and_option_errors(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=rf"ragged_paged_attention: {match}"):
        _check(**overrides)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"num_seqs": jnp.asarray(4, jnp.int32)}, r"num_seqs is 4 but needs 0 <= num_seqs <= S=3"),
        ({"num_seqs": jnp.asarray(-1, jnp.int32)}, r"num_seqs is -1"),
        ({"kv_lens": jnp.asarray([5, -1, 3], jnp.int32)}, r"kv_lens has negative entries \[1\]=-1"),
        ({"kv_lens": jnp.asarray([5, 8, 13], jnp.int32)},
         r"kv_lens has entries \[2\]=13 but needs kv_lens <= pages_per_seq \* page = 3 \* 4 = 12"),
        ({"cu_q_lens": jnp.asarray([0, 2, 1, 6], jnp.int32)}, r"cu_q_lens gives negative query lengths \[1\]=-1"),
        ({"cu_q_lens": jnp.asarray([0, 2, 3, 8], jnp.int32)}, r"cu_q_lens ends at 8 .* needs an end <= T=7"),
        ({"cu_q_lens": jnp.asarray([-1, 2, 3, 6], jnp.int32)}, r"cu_q_lens starts at -1"),
        ({"cu_q_lens": jnp.asarray([0, 2, 3, 7], jnp.int32)},
         r"cu_q_lens gives sequence 2 4 queries but kv_lens\[2\] is 3"),
        ({"page_indices": jnp.asarray([[0, 1, 2], [3, 99, 4], [5, 6, 7]], jnp.int32)},
         r"page_indices\[1, 1\] is 99 but needs a page index in \[0, P=\d+\)"),
        ({"page_indices": jnp.asarray([[0, -1, 2], [3, 4, 5], [6, 7, 8]], jnp.int32)},
         r"page_indices\[0, 1\] is -1"),
    ],
    ids=["num_seqs_big", "num_seqs_negative", "kv_negative", "kv_over_capacity", "cu_decreasing", "cu_past_T",
         "cu_negative_start", "q_longer_than_kv", "page_too_big", "page_negative"],
)
def test_check_value_errors(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=rf"ragged_paged_attention: {match}"):
        _check(**overrides)


def test_check_values_only_for_live_sequences_and_used_pages() -> None:
    # Sequence 2 is dead (num_seqs=2): its garbage does not matter; neither do unused table entries.
    _check(num_seqs=jnp.asarray(2, jnp.int32), kv_lens=jnp.asarray([5, 8, -7], jnp.int32),
           cu_q_lens=jnp.asarray([0, 2, 3, 1], jnp.int32))
    _check(page_indices=jnp.asarray([[0, 1, -5], [2, 3, 777], [4, 5, 6]], jnp.int32))
    _check(num_seqs=3)  # a Python int is a concrete scalar


def test_check_skips_values_under_tracing() -> None:
    valid = _valid()
    bad_lens = jnp.asarray([50, -1, 3], jnp.int32)

    def traced(kv_lens: jax.Array, num_seqs: jax.Array) -> None:
        args = {**valid, "kv_lens": kv_lens, "num_seqs": num_seqs}
        check_ragged_paged_attention_args(*[args[name] for name in ARRAYS], softmax_scale=None,
                                          sliding_window=None, logits_soft_cap=None)

    jax.jit(traced)(bad_lens, jnp.asarray(9, jnp.int32))  # values unknown: nothing to check
    with pytest.raises(ValueError, match="num_seqs has shape"):  # shapes are still checked
        jax.jit(traced)(bad_lens, jnp.asarray([1, 2], jnp.int32))
