"""The Triton latent (MLA) paged attention against the float64 reference: values, masks, edges, gates, configs.

On a CPU the kernel runs through Triton's interpreter (``EJK_TRITON_INTERPRET=1``, see conftest.py),
so the shapes are small (Dk = 64 + 16); tests marked ``gpu`` run DeepSeek-V3's 576 / 512 compiled on
an NVIDIA GPU.
"""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ejk
from ejk.testing import assert_close, check_op, mla_batch, mla_paged_attention_float64
from ejk_triton import _env
from ejk_triton import _mla_attention as mla
from ejk_triton._mla_attention import MlaAttentionConfig, capability, config_space, heuristic_config

ON_GPU = _env.nvidia_gpu()[0]
needs_kernels = pytest.mark.skipif(not (ON_GPU or _env.interpret_mode()),
                                   reason="needs an NVIDIA GPU or EJK_TRITON_INTERPRET=1")


def cfg(block_h: int = 16, block_kv: int = 16, splits: int = 1) -> MlaAttentionConfig:
    return MlaAttentionConfig(block_h=block_h, block_kv=block_kv, num_splits=splits, num_warps=4)


def check(args: list[Any], config: MlaAttentionConfig | None, *, dv: int = 64, **options: Any) -> np.ndarray:
    """Run the op on the Triton platform and compare with the float64 reference; returns the output."""
    out = ejk.mla_paged_attention(*args, v_head_dim=dv, platform="triton", cfg=config, **options)
    want = mla_paged_attention_float64(*args, v_head_dim=dv, **options)
    assert out.shape == want.shape and out.dtype == args[0].dtype
    assert_close(out, want, args[0].dtype, what=f"{config} {options}")
    got = np.asarray(out, np.float32)
    assert np.all(np.isfinite(got))
    return got


SCENARIOS: dict[str, tuple[dict[str, Any], MlaAttentionConfig | None, dict[str, Any]]] = {
    # decode, split-KV over ragged contexts (odd lengths, 1-key contexts), pages of 4 (a block spans pages)
    "decode_splits": ({"kv_lens": (9, 1, 23, 4)}, cfg(splits=3), {}),
    "decode_heuristic": ({"kv_lens": (30, 7, 12), "page": 8}, None, {}),
    # multi-token prediction, causal: the first queries of a short context see nothing
    "mtp_causal": ({"kv_lens": (13, 2, 0, 3), "sq": 3}, cfg(splits=2), {}),
    "mtp_not_causal": ({"kv_lens": (13, 2, 0, 3), "sq": 2}, cfg(splits=2), {"causal": False}),
    # heads over several programs (block_h < Hq), 32-key pages: one page per block
    "head_blocks": ({"kv_lens": (40, 35), "sq": 2, "page": 32, "hq": 8}, cfg(block_h=2, block_kv=32, splits=2), {}),
    # pages of 3 (not a power of two), a scale, Hq not a power of two
    "odd_page": ({"kv_lens": (5, 19), "page": 3, "hq": 6, "sq": 2}, cfg(block_h=4), {"softmax_scale": 0.2}),
    "single_key": ({"kv_lens": (1,), "page": 1, "hq": 1}, None, {}),
    # 40 heads x 2 tokens in one program: 128 rows, the last 48 padding
    "many_heads": ({"kv_lens": (21, 6), "sq": 2, "hq": 40, "dk": 24}, cfg(block_h=64, splits=2), {"dv": 16}),
    "empty_contexts": ({"kv_lens": (0, 0), "sq": 2}, cfg(splits=2), {}),
}


@needs_kernels
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenarios(scenario: str) -> None:
    shape, config, options = SCENARIOS[scenario]
    args = mla_batch(1, **{"hq": 4, **shape})
    out = check(args, config, **options)
    lens = np.asarray(args[2])
    sq = args[0].shape[1]
    if options.get("causal", True):  # query i of a sequence with kv_len < Sq - i sees nothing: zeros
        for b, n in enumerate(lens):
            assert not np.any(out[b, : max(sq - int(n), 0)])


@needs_kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16], ids=["f32", "f16", "bf16"])
def test_dtypes(dtype: Any) -> None:
    check(mla_batch(2, kv_lens=(11, 8, 17), sq=2, hq=4, dtype=dtype), cfg(splits=2))


@needs_kernels
@pytest.mark.parametrize(("dk", "dv"), [(64, 64), (40, 24), (48, 16)], ids=["no_rope", "odd_dims", "wide_rope"])
def test_head_dims(dk: int, dv: int) -> None:
    """Values all of Dk (no rotary part), dims that are not powers of two, a rotary part wider than the values."""
    check(mla_batch(3, kv_lens=(9, 14), sq=2, hq=4, dk=dk), cfg(splits=2), dv=dv)


@needs_kernels
def test_random_batches() -> None:
    rng = np.random.default_rng(7)
    for seed in range(2):
        kv_lens = tuple(int(x) for x in rng.integers(0, 40, size=int(rng.integers(1, 4))))
        args = mla_batch(seed, kv_lens=kv_lens, sq=int(rng.integers(1, 4)), hq=int(rng.choice([1, 3, 4])),
                         page=int(rng.choice([2, 5, 16])))
        config = cfg(block_h=int(rng.choice([1, 2, 4])), block_kv=int(rng.choice([16, 32])),
                     splits=int(rng.integers(1, 4)))
        check(args, config, causal=bool(rng.integers(0, 2)))


@needs_kernels
def test_unseen_nan_does_not_leak_and_seen_nan_propagates() -> None:
    q, kv, lens, table = mla_batch(5, kv_lens=(6, 11), sq=2, hq=4, spare_pages=3)
    used = {int(table[b, j]) for b in range(2) for j in range(-(-int(lens[b]) // 4))}
    poisoned = np.array(kv)
    for page in set(range(kv.shape[0])) - used:  # pages nobody uses
        poisoned[page] = np.nan
    poisoned[int(table[0, 1]), 2:] = np.nan  # the tail past sequence 0's 6 positions
    for config in (cfg(splits=2), cfg(block_kv=32)):
        out = ejk.mla_paged_attention(q, jnp.asarray(poisoned), lens, table, v_head_dim=64, platform="triton",
                                      cfg=config)
        assert np.all(np.isfinite(np.asarray(out))), config
        assert_close(out, mla_paged_attention_float64(q, kv, lens, table, v_head_dim=64), jnp.float32)
    # position 5 of sequence 0, inside its context, is seen by its last query: NaN there, never in sequence 1
    poisoned[int(table[0, 1]), 1] = np.nan
    out = np.asarray(ejk.mla_paged_attention(q, jnp.asarray(poisoned), lens, table, v_head_dim=64,
                                             platform="triton", cfg=cfg(splits=2)))
    assert np.all(np.isnan(out[0, 1])) and np.all(np.isfinite(out[1]))


@needs_kernels
def test_traced_lengths_and_vmap() -> None:
    args = mla_batch(6, kv_lens=(9, 3), sq=2, hq=4)
    want = mla_paged_attention_float64(*args, v_head_dim=64)
    run = jax.jit(lambda *a: ejk.mla_paged_attention(*a, v_head_dim=64, platform="triton", cfg=cfg(splits=2)))
    assert_close(run(*args), want, jnp.float32)
    stacked = [jnp.stack([x, x]) for x in args]
    out = jax.vmap(run)(*stacked)
    assert out.shape == (2, *want.shape)
    assert_close(out[1], want, jnp.float32)


@needs_kernels
def test_empty_shapes() -> None:
    q, kv, lens, table = mla_batch(4, kv_lens=(3, 4), hq=4)
    run = lambda *a: ejk.mla_paged_attention(*a, v_head_dim=64, platform="triton")  # noqa: E731
    assert run(q[:, :0], kv, lens, table).shape == (2, 0, 4, 64)
    assert run(q[:0], kv, lens[:0], table[:0]).shape == (0, 1, 4, 64)


@needs_kernels
def test_conformance() -> None:
    assert check_op("mla_paged_attention", "triton", dtypes=(jnp.bfloat16,)) == 3


# ----------------------------------------------------------------------------------------------
# Gate and configs (abstract shapes; no kernel runs)
# ----------------------------------------------------------------------------------------------

def _sds(*shape: int, dtype: Any = jnp.bfloat16) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def deepseek(batch: int = 64, ctx: int = 4096, sq: int = 1, hq: int = 16,
             dtype: Any = jnp.bfloat16) -> tuple[Any, ...]:
    per_seq = ctx // 64
    return (_sds(batch, sq, hq, 576, dtype=dtype), _sds(batch * per_seq, 64, 576, dtype=dtype),
            _sds(batch, dtype=jnp.int32), _sds(batch, per_seq, dtype=jnp.int32))


def test_capability() -> None:
    assert capability(*deepseek(), v_head_dim=512) in (None, capability(*deepseek(), v_head_dim=512))
    q, kv, lens, table = deepseek()
    assert "share one dtype" in str(capability(q, _sds(*kv.shape, dtype=jnp.float16), lens, table, v_head_dim=512))
    assert "float64" in str(capability(_sds(*q.shape, dtype=jnp.float64), kv, lens, table, v_head_dim=512))
    assert "v_head_dim 1024" in str(capability(_sds(1, 1, 1, 1088), _sds(4, 64, 1088), lens, table,
                                               v_head_dim=1024))
    assert "key dims past v_head_dim" in str(capability(q, kv, lens, table, v_head_dim=256))
    assert "in float32" in str(capability(*deepseek(dtype=jnp.float32), v_head_dim=512))
    assert "query tokens" in str(capability(_sds(1, 129, 1, 576), kv, lens, table, v_head_dim=512))
    assert "grid limit" in str(capability(_sds(70000, 1, 1, 576), kv, lens, table, v_head_dim=512))


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configs as on an H100 (132 SMs), not the interpreter's small ones."""
    monkeypatch.setattr(mla._env, "interpreting_on_cpu", lambda: False)
    monkeypatch.setattr(mla, "_sm_count", lambda: 132)
    monkeypatch.setattr(mla, "_smem_limit", lambda: 227 * 1024)


@pytest.mark.usefixtures("compiled")
def test_heuristic_on_flashmla_shapes() -> None:
    # Hq 16, decode: every head in one program (16 rows), split so 64 sequences fill 132 SMs
    small = heuristic_config(*deepseek(batch=64, hq=16), v_head_dim=512)
    assert (small.block_h, small.block_kv) == (16, 64) and small.num_splits > 1
    assert mla.smem_bytes(small, deepseek()[0], 512) <= 227 * 1024
    # Hq 128: blocks of 64 rows (64 heads at Sq 1, 32 at Sq 2); batch 128 already fills the GPU
    big = heuristic_config(*deepseek(batch=128, hq=128), v_head_dim=512)
    assert (big.block_h, big.num_warps, big.num_splits) == (64, 8, 1)
    mtp = heuristic_config(*deepseek(batch=64, sq=2, hq=128), v_head_dim=512)
    assert mtp.block_h == 32 and mla.smem_bytes(mtp, deepseek(sq=2, hq=128)[0], 512) <= 227 * 1024
    # one long sequence: many splits, each with at least 4 steps
    one = heuristic_config(*deepseek(batch=1, ctx=32768, hq=16), v_head_dim=512)
    assert 16 <= one.num_splits <= 64


@pytest.mark.usefixtures("compiled")
def test_config_space_starts_with_the_heuristic_and_fits() -> None:
    call = deepseek(batch=64, sq=2, hq=64)
    space = config_space(*call, v_head_dim=512)
    assert space[0] == heuristic_config(*call, v_head_dim=512)
    assert len(space) == len(set(space)) <= 16
    assert all(mla.smem_bytes(c, call[0], 512) <= 227 * 1024 for c in space)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="block_h"):
        MlaAttentionConfig(block_h=3)
    with pytest.raises(ValueError, match="num_splits"):
        MlaAttentionConfig(num_splits=0)
    assert attrs.evolve(MlaAttentionConfig(), block_kv=32).block_kv == 32


_AOT_SCRIPT = """
import json, jax, jax.numpy as jnp
from ejk_triton import _mla_attention as mla
from ejk_triton._aot import compile_mla_paged_attention
mla._sm_count = lambda: 132
sds = jax.ShapeDtypeStruct
def shapes(batch, sq, hq, ctx=4096):
    kv = sds((batch * ctx // 64, 64, 576), jnp.bfloat16)
    return sds((batch, sq, hq, 576), jnp.bfloat16), kv, sds((batch, ctx // 64), jnp.int32)
report = {}
for name, call in {"decode Hq 16": shapes(64, 1, 16), "mtp Sq 2 Hq 128": shapes(64, 2, 128)}.items():
    cfg = mla.heuristic_config(call[0], call[1], None, call[2], v_head_dim=512)
    report[name] = {**compile_mla_paged_attention(*call, v_head_dim=512, cfg=cfg),
                    "estimate": mla.smem_bytes(cfg, call[0], 512)}
print(json.dumps(report))
"""


def test_kernel_compiles_for_sm90_without_a_gpu(compile_report: Any) -> None:
    # Compiles the kernel as a GPU would (PTX, then a cubin with the ptxas Triton ships) in a process
    # without the interpreter, for DeepSeek-V3's dims with the heuristic's configs: it fits the H100's
    # shared memory, and the estimate the configs are pruned with is what Triton allocates.
    report = compile_report(_AOT_SCRIPT)
    assert len(report) == 2
    for variant, info in report.items():
        assert 0 < info["shared"] == info["estimate"] <= 227 * 1024, f"{variant}: {info}"


# ----------------------------------------------------------------------------------------------
# GPU: DeepSeek-V3's dims, compiled
# ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("sq", "hq"), [(1, 16), (1, 128), (2, 64), (2, 128)])
def test_deepseek_dims_on_gpu(sq: int, hq: int) -> None:
    args = mla_batch(8, kv_lens=(4096, 1, 0, 777, 2050, 64, 3000, 65), sq=sq, hq=hq, dk=576, page=64,
                     dtype=jnp.bfloat16)
    check(args, None, dv=512, softmax_scale=192**-0.5)
    for splits in (1, 7):
        check(args, attrs.evolve(heuristic_config(*args, v_head_dim=512), num_splits=splits), dv=512)
