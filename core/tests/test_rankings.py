"""Rankings as data: a config pack orders implementations per device and shape class in the heuristics
tier, before tiers and priorities; the user's cache and an explicit cfg still win; bad rankings are
reported against their plugin and ignored."""

from __future__ import annotations

import fnmatch
import inspect
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import ejk
import ejk.plugins
from ejk.config.packs import CORE_PACKS_DIR, load_pack
from ejk.config.rankings import Condition, RankingError
from ejk.ops import Extension, ImplChoice, OpKernel
from ejk.plugins import PlatformStatus

BIG = jax.ShapeDtypeStruct((8, 4), jnp.float32)
SMALL = jax.ShapeDtypeStruct((2, 4), jnp.float32)
HALF = jax.ShapeDtypeStruct((8, 4), jnp.bfloat16)


class Toy(OpKernel):
    """``toy(x, *, causal)``: two implementations, ``a`` first by priority."""

    op_id = "toy"
    version = "1"
    array_names = ("x",)
    positional = 1

    def normalize(self, x: Any, *, causal: bool = False) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (x,), {"causal": bool(causal)}


def double(x: jax.Array, *, causal: bool, cfg: Any = None) -> jax.Array:
    return 2 * x


def double_gated(x: jax.Array, *, causal: bool, gate: str | None = None, cfg: Any = None) -> jax.Array:
    return 2 * x


def _plugin(packs: list[Path], fn: Any = double) -> object:
    class Plugin:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("toy", "xla", "any", priority=10, name="a")(fn)
            register("toy", "xla", "any", priority=0, name="b")(fn)

        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="xla", available=True)

        @ejk.hookimpl
        def ejk_config_packs(self) -> list[Path]:
            return packs

    return Plugin()


def _pack(path: Path, rankings: Any) -> Path:
    path.write_text(json.dumps({"format": "ejk-config-pack", "schema": 1, "rankings": {"toy": rankings}}))
    return path


def _toy(*packs: Path) -> Toy:
    host = ejk.plugins.get_plugin_host()  # the private, empty host of conftest
    host.register_plugin(_plugin(list(packs)), "ranker")
    return Toy(host.registry)


def _chosen(kernel: Toy, x: Any, **kwargs: Any) -> str:
    found = ejk.explain(kernel, x, executor=_executor(), **kwargs)
    assert found.tier == "heuristic"
    return kernel.cfg_label(found.chosen)


def _executor(**chain: Any) -> ejk.Executor[Any, Any]:
    return ejk.Executor(ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(autotune=False), **chain))


B_FIRST = {"device": "cpu*", "when": {"x.shape[0]": {"min": 4}, "x.dtype": "float32", "causal": True},
           "order": ["xla/any:b", "xla/any:a"], "source": "a toy measurement"}


class GatedToy(Toy):
    """``toy(x, *, causal, gate=None)``: ``gate`` an extension the call leaves out when it is ``None``."""

    extensions = (Extension("gate", legacy=None, since="0.2.0"),)

    def normalize(self, x: Any, *, causal: bool = False, gate: str | None = None) -> tuple[tuple[Any, ...],
                                                                                           dict[str, Any]]:
        return (x,), {"causal": bool(causal), **({} if gate is None else {"gate": gate})}


def test_a_ranking_reads_an_extension_the_call_leaves_out_as_its_legacy_value(tmp_path: Path,
                                                                              recwarn: pytest.WarningsRecorder) -> None:
    """A shape class naming an extension argument (``grouped_matmul``'s ``activation``) holds or not for calls that
    leave it out, as its legacy value would: it is not reported as naming an argument the op lacks."""
    gated = {"device": "cpu*", "when": {"gate": "on"}, "order": ["xla/any:b"], "source": "gated calls"}
    plain = {"device": "cpu*", "when": {"gate": None, "causal": True}, "order": ["xla/any:b"], "source": "plain"}
    host = ejk.plugins.get_plugin_host()
    host.register_plugin(_plugin([_pack(tmp_path / "gated.json", [gated, plain])], double_gated), "ranker")
    kernel = GatedToy(host.registry)
    assert _chosen(kernel, BIG, gate="on") == "xla/any:b"
    assert _chosen(kernel, BIG) == "xla/any:a"  # no gate: the gated ranking does not hold, nor the plain one
    assert _chosen(kernel, BIG, causal=True) == "xla/any:b"  # the plain one holds
    assert not [w for w in recwarn if "is ignored" in str(w.message)]


def test_without_a_ranking_tier_then_priority_decide() -> None:
    kernel = _toy()
    assert _chosen(kernel, BIG, causal=True) == "xla/any:a"
    assert ejk.explain(kernel, BIG, executor=_executor()).ranking == "tier fast, priority 10"


def test_a_ranking_puts_b_first_on_its_device_for_its_shape_class_only(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "ranks.json", [B_FIRST])
    kernel = _toy(pack)
    assert _chosen(kernel, BIG, causal=True) == "xla/any:b"
    assert _chosen(kernel, SMALL, causal=True) == "xla/any:a"  # below the shape range
    assert _chosen(kernel, HALF, causal=True) == "xla/any:a"  # another dtype
    assert _chosen(kernel, BIG, causal=False) == "xla/any:a"  # another static argument
    found = ejk.explain(kernel, BIG, causal=True, executor=_executor())
    assert found.ranking is not None and f"ranked by pack {pack} for device cpu*" in found.ranking
    assert "when x.shape[0] in [4, ], x.dtype=float32, causal=true" in found.ranking
    assert "a toy measurement" in found.ranking
    (other,) = [r for r in found.implementations if r.label == "xla/any:a"]
    assert other.status == "usable" and other.reason is not None and "#2, ranked by pack" in other.reason
    # The ejk.Executor runs the ranked choice, and the selection event names it.
    events: list[Any] = []
    runner = _executor(on_event=events.append)
    runner(kernel, jnp.ones((8, 4)), causal=True, platform="auto")
    assert [(e.tier, e.implementation) for e in events] == [("heuristic", "xla/any:b")]


def test_a_ranking_for_another_device_changes_nothing(tmp_path: Path) -> None:
    kernel = _toy(_pack(tmp_path / "h100.json", [{**B_FIRST, "device": "gpu|NVIDIA_H100*"}]))
    assert _chosen(kernel, BIG, causal=True) == "xla/any:a"


def test_labels_of_implementations_not_installed_are_skipped(tmp_path: Path) -> None:
    kernel = _toy(_pack(tmp_path / "ranks.json", [{"device": "cpu*", "order": ["acme/gpu:warp", "xla/any:b"]}]))
    assert _chosen(kernel, BIG) == "xla/any:b"  # no warning either: warnings are errors here


def test_a_later_ranking_orders_only_what_earlier_ones_leave_tied(tmp_path: Path) -> None:
    first = _pack(tmp_path / "first.json", [{"device": "cpu*", "order": ["acme/gpu:warp"]}])
    second = _pack(tmp_path / "second.json", [{"device": "*", "order": ["xla/any:b"]}])
    assert _chosen(_toy(first, second), BIG) == "xla/any:b"


def test_malformed_rankings_are_reported_against_their_plugin_and_ignored(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "bad.json", [
        {"device": "cpu*", "order": "xla/any:b"},  # not a list
        {"device": "cpu*", "order": ["xla/any:b"], "wehn": {}},  # a misspelt key
        {"device": "cpu*", "order": ["b"]},  # not a label
        {"device": "cpu*", "order": ["xla/any:b"], "when": {"x.shape[0]": {"min": 9, "max": 1}}},
        {"device": "cpu*", "order": ["xla/any:b"], "when": {"seq_len": 8}},  # toy has no such argument
    ])
    kernel = _toy(pack)
    with pytest.warns(RuntimeWarning, match="is ignored") as caught:
        assert _chosen(kernel, BIG) == "xla/any:a"
    messages = "\n".join(str(w.message) for w in caught)
    for index in range(5):
        assert f"rankings['toy'][{index}] is ignored" in messages
    assert "from plugin ranker" in messages and "'wehn'" in messages and "no argument 'seq_len'" in messages
    errors = ejk.plugins.get_plugin_host().plugins["ranker"].hook_errors
    assert len(errors) == 5 and all(e.startswith(f"ejk_config_packs: pack {pack} rankings['toy']") for e in errors)


def test_a_malformed_ranking_leaves_the_good_ones_of_its_pack_in_use(tmp_path: Path) -> None:
    kernel = _toy(_pack(tmp_path / "mixed.json", [{"device": 7, "order": ["xla/any:b"]}, B_FIRST]))
    with pytest.warns(RuntimeWarning, match=r"rankings\['toy'\]\[0\] is ignored: device needs"):
        assert _chosen(kernel, BIG, causal=True) == "xla/any:b"


def test_a_pack_whose_rankings_section_is_not_an_object_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps({"format": "ejk-config-pack", "rankings": ["xla/any:b"]}))
    kernel = _toy(path)
    with pytest.warns(RuntimeWarning, match="rankings needs an object"):
        assert _chosen(kernel, BIG) == "xla/any:a"


def test_an_explicit_cfg_the_users_cache_and_a_policy_hook_still_win(tmp_path: Path) -> None:
    kernel = _toy(_pack(tmp_path / "ranks.json", [B_FIRST]))
    a = ImplChoice(platform="xla", backend="any", implementation="a")
    found = ejk.explain(kernel, BIG, causal=True, cfg=a, executor=_executor())
    assert found.tier == "override" and kernel.cfg_label(found.chosen) == "xla/any:a" and found.ranking is None
    chain: ejk.ConfigSelectorChain[Any] = ejk.ConfigSelectorChain(policy=ejk.AutotunePolicy(autotune=False),
                                                                  persistent_dir=tmp_path / "cache")
    executor = ejk.Executor(chain)
    inv = executor.invocation(kernel, (BIG,), {"causal": True, "platform": "auto"})
    persistent = chain.persistent_cache(kernel)
    assert persistent is not None
    persistent.put(*inv.cache_key, a, source="autotune")
    found = ejk.explain(kernel, BIG, causal=True, executor=executor)
    assert found.tier == "persistent" and kernel.cfg_label(found.chosen) == "xla/any:a"
    with ejk.overlay_cache({inv.cache_key: a}):
        assert kernel.cfg_label(ejk.explain(kernel, BIG, causal=True, executor=_executor()).chosen) == "xla/any:a"


def test_tiers_order_before_priority_and_rank_breaks_ties_inside_a_tier() -> None:
    registry = ejk.KernelRegistry()
    registry.register("toy", "xla", "any", priority=100, tier=ejk.Tier.PORTABLE, name="portable")(double)
    registry.register("toy", "xla", "any", priority=-5, name="fast")(double)  # FAST: the default
    registry.register("toy", "xla", "any", priority=0, tier="untested", name="untested")(double)
    registry.register("toy", "xla", "any", priority=-9, tier="VENDOR", name="vendor")(double)
    registry.register("toy", "xla", "any", priority=-10, name="ranked", rank=lambda **call: 1000)(double)
    assert [s.name for s in registry.list_implementations("toy")] == ["vendor", "fast", "ranked", "portable",
                                                                      "untested"]
    assert registry.get_spec("toy").name == "vendor"
    kernel = Toy(registry)
    inv = _executor().invocation(kernel, (BIG,), {"causal": False, "platform": "auto"})
    ordered = [spec.name for spec, _ in kernel.ranking(registry.list_implementations("toy"), inv)]
    assert ordered == ["vendor", "ranked", "fast", "portable", "untested"]  # rank: a tie-break inside FAST only
    with pytest.raises(ValueError, match="tier 'best' is not known"):
        registry.register("toy", "xla", "any", tier="best", name="other")(double)


def test_conditions_parse_and_match_the_call_view() -> None:
    call = {"q": jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16), "bias": None, "causal": True, "window": 3}
    assert Condition.parse("q.shape[-1]", [64, 128]).holds(call)
    assert not Condition.parse("q.shape[7]", 64).holds(call)  # no such axis: not in the class
    assert Condition.parse("q.ndim", 4).holds(call) and Condition.parse("q.dtype", "bfloat16").holds(call)
    assert Condition.parse("q.size", {"max": 2 * 128 * 4 * 64}).holds(call)  # elements: rows of any rank
    assert not Condition.parse("q.size", {"max": 2 * 128 * 4 * 64 - 1}).holds(call)
    assert Condition.parse("bias", None).holds(call) and not Condition.parse("bias.dtype", "float32").holds(call)
    assert Condition.parse("causal", True).holds(call) and not Condition.parse("window", True).holds(call)
    assert Condition.parse("window", {"max": 3}).holds(call) and not Condition.parse("causal", {"min": 0}).holds(call)
    for key, value in (("q.stride", 1), ("q.shape[x]", 1), ("q", []), ("q", {"min": "a"}), ("q", {"below": 1})):
        with pytest.raises(RankingError):
            Condition.parse(key, value)
    with pytest.raises(RankingError, match="not an array"):
        Condition.parse("causal.dtype", "bool").holds(call)


def test_a_ratio_of_two_sizes_names_queries_per_sequence() -> None:
    decode = {"q": jax.ShapeDtypeStruct((8, 32, 128), jnp.bfloat16), "kv_lens": jax.ShapeDtypeStruct((8,), jnp.int32)}
    prefill = {**decode, "q": jax.ShapeDtypeStruct((8 * 256, 32, 128), jnp.bfloat16)}
    empty = {**decode, "kv_lens": jax.ShapeDtypeStruct((0,), jnp.int32)}
    per_sequence = Condition.parse("q.shape[0]/kv_lens.shape[0]", {"min": 2})
    assert per_sequence.holds(prefill) and not per_sequence.holds(decode)
    assert per_sequence.value(prefill) == (True, 256.0)
    assert not per_sequence.holds(empty)  # a ratio over 0 is unknown: not in the class
    assert str(per_sequence) == "q.shape[0]/kv_lens.shape[0] in [2, ]"
    for key, value in (("q.shape[0]/kv_lens.shape[0]", 2), ("q.shape[0]/kv_lens.dtype", {"min": 1}),
                       ("q.shape[0]/kv_lens.shape[0]/q.shape[1]", {"min": 1}), ("q.shape[0]/", {"min": 1})):
        with pytest.raises(RankingError):
            Condition.parse(key, value)
    with pytest.raises(RankingError, match="no argument 'lens'"):
        Condition.parse("q.shape[0]/lens.shape[0]", {"min": 1}).holds(decode)


def _shipped(name: str) -> Any:
    return load_pack(str(CORE_PACKS_DIR / f"{name}.json"))


def test_the_shipped_packs_are_valid_and_cover_the_h100() -> None:
    assert sorted(p.stem for p in CORE_PACKS_DIR.glob("*.json")) == ["nvidia_h100", "nvidia_h200"]
    h100 = _shipped("nvidia_h100")
    assert h100.problems == () and h100.entries == {}
    assert set(h100.rankings) == {"flash_attention", "flash_attention_lse", "flash_attention_varlen", "matmul",
                                  "grouped_matmul", "ragged_paged_attention", "linear_cross_entropy", "rms_norm",
                                  "ssd", "mla_paged_attention"}
    for op, rankings in h100.rankings.items():
        arguments = set(inspect.signature(getattr(ejk, op)).parameters)
        for ranking in rankings:
            assert ranking.source and fnmatch.fnmatchcase("gpu|NVIDIA_H100_80GB_HBM3|cc=9.0", ranking.device)
            assert not ranking.applies("gpu|NVIDIA_A100-SXM4-80GB|cc=8.0", {})
            named = {c.argument for c in ranking.when} | {c.divisor.argument for c in ranking.when if c.divisor}
            assert named <= arguments, (op, named - arguments)


@pytest.mark.parametrize(("name", "device"), [("nvidia_h100", "gpu|NVIDIA_H100_80GB_HBM3|cc=9.0"),
                                              ("nvidia_h200", "gpu|NVIDIA_H200|cc=9.0")])
def test_the_hopper_packs_put_the_mosaic_mla_kernel_first_from_64_rows_a_sequence(name: str, device: str) -> None:
    pack = _shipped(name)

    def order(sq: int, hq: int, dk: int = 576) -> tuple[str, ...] | None:
        call = {"q": jax.ShapeDtypeStruct((64, sq, hq, dk), jnp.bfloat16),
                "kv_lens": jax.ShapeDtypeStruct((64,), jnp.int32)}
        found = [r for r in pack.rankings["mla_paged_attention"] if r.orders("fwd") and r.applies(device, call)]
        return tuple(found[0].order) if found else None

    assert order(1, 64) == order(1, 128) == order(2, 128) == ("pallas/gpu:mosaic", "triton/gpu:mla")
    assert order(1, 16) is None and order(2, 16) is None and order(2, 128, dk=192) is None


def test_the_h200_pack_ranks_only_what_was_measured_on_an_h200() -> None:
    """The H200 pack holds the rankings measured on an H200 (attention training shapes, MLA decode, paged decode and
    prefill, 64-expert and SwiGLU-gated grouped matmuls, large RMSNorms); the H100 pack does not reach it."""
    h200 = _shipped("nvidia_h200")
    assert h200.problems == () and h200.entries == {}
    assert set(h200.rankings) == {"flash_attention", "grouped_matmul", "mla_paged_attention", "ragged_paged_attention",
                                  "rms_norm"}
    for op, rankings in h200.rankings.items():
        arguments = set(inspect.signature(getattr(ejk, op)).parameters)
        for ranking in rankings:
            assert ranking.source and "h200" in ranking.source.lower()
            named = {c.argument for c in ranking.when} | {c.divisor.argument for c in ranking.when if c.divisor}
            assert named <= arguments, (op, named - arguments)
            assert fnmatch.fnmatchcase("gpu|NVIDIA_H200|cc=9.0", ranking.device)
            assert not fnmatch.fnmatchcase("gpu|NVIDIA_H100_80GB_HBM3|cc=9.0", ranking.device)
    for rankings in _shipped("nvidia_h100").rankings.values():
        for ranking in rankings:
            assert not fnmatch.fnmatchcase("gpu|NVIDIA_H200|cc=9.0", ranking.device)


def test_the_h200_pack_trains_d128_attention_on_cudnn_and_runs_its_forward_on_mosaic() -> None:
    """Measured on an H200: Mosaic GPU's forward first at d64 / d128; differentiated, cuDNN at d128 and Mosaic GPU at
    d64; cuDNN at d256. Calls with segment ids or a window were not measured there: no ranking covers them."""
    h200 = _shipped("nvidia_h200")
    device = "gpu|NVIDIA_H200|cc=9.0"

    def first(mode: str, head_dim: int = 128, **options: Any) -> str | None:
        q = jax.ShapeDtypeStruct((4, 4096, 16, head_dim), jnp.bfloat16)
        call = {"q": q, "k": q, "causal": True, "q_segment_ids": None, "sliding_window": None, **options}
        found = [r for r in h200.rankings["flash_attention"] if r.orders(mode) and r.applies(device, call)]
        return found[0].order[0] if found else None

    assert first("fwd") == first("fwd", 64) == first("fwd+bwd", 64) == "pallas/gpu:mosaic"
    assert first("fwd+bwd") == first("fwd", 256) == first("fwd+bwd", 256) == "xla/gpu:cudnn"
    ids = jax.ShapeDtypeStruct((4, 4096), jnp.int32)
    assert first("fwd", q_segment_ids=ids) is None and first("fwd+bwd", sliding_window=(128, 0)) is None


def test_the_h200_pack_sends_small_expert_groups_to_triton() -> None:
    h200 = _shipped("nvidia_h200")
    device = "gpu|NVIDIA_H200|cc=9.0"

    def grouped(rows: int, experts: int, k: int, **static: Any) -> str | None:
        call = {"lhs": jax.ShapeDtypeStruct((rows, k), jnp.bfloat16),
                "rhs": jax.ShapeDtypeStruct((experts, k, 1536), jnp.bfloat16), "activation": None, **static}
        found = [r for r in h200.rankings["grouped_matmul"] if r.applies(device, call)]
        return found[0].order[0] if found else None

    assert grouped(32768, 64, 2048) == grouped(8192, 64, 2048) == "triton/gpu:persistent"
    assert grouped(16384, 8, 4096) is None and grouped(131072, 64, 2048) is None  # not measured on an H200
    # SwiGLU-gated calls: the plain product then the activation, ahead of the fused epilogue, at every size.
    for rows, experts, k in ((32768, 64, 2048), (16384, 8, 4096), (131072, 64, 2048)):
        assert grouped(rows, experts, k, activation="swiglu") == "xla/any:composed"


def test_the_h200_pack_orders_large_rms_norms_by_what_was_measured() -> None:
    """ejk-triton's norm first for large calls, forward and forward+backward; small calls (decode steps, where XLA
    fuses its norm with its neighbours) are not ranked."""
    h200 = _shipped("nvidia_h200")
    device = "gpu|NVIDIA_H200|cc=9.0"

    def first(mode: str, rows: int, dim: int, residual: bool = False) -> str | None:
        x = jax.ShapeDtypeStruct((rows, dim), jnp.bfloat16)
        call = {"x": x, "scale": jax.ShapeDtypeStruct((dim,), jnp.bfloat16), "residual": x if residual else None}
        found = [r for r in h200.rankings["rms_norm"] if r.orders(mode) and r.applies(device, call)]
        return found[0].order[0] if found else None

    assert first("fwd", 16384, 4096) == first("fwd", 16384, 8192) == "triton/gpu:fused"
    assert first("fwd", 16384, 4096, residual=True) == "triton/gpu:fused"
    assert first("fwd+bwd", 16384, 4096) == first("fwd+bwd", 16384, 8192) == "triton/gpu:fused"
    assert first("fwd", 8, 4096) is None and first("fwd+bwd", 8, 4096) is None


def test_the_h100_pack_orders_packed_d128_attention_by_its_mask() -> None:
    h100 = _shipped("nvidia_h100")
    device = "gpu|NVIDIA_H100_80GB_HBM3|cc=9.0"

    def order(dtype: Any, head_dim: int, mode: str = "fwd+bwd", causal: bool = True) -> tuple[str, ...] | None:
        call = {"q": jax.ShapeDtypeStruct((32768, 16, head_dim), dtype), "causal": causal}
        found = [r for r in h100.rankings["flash_attention_varlen"] if r.orders(mode) and r.applies(device, call)]
        return tuple(found[0].order) if found else None

    assert order(jnp.bfloat16, 128, causal=False) == order(jnp.float16, 128, "fwd", causal=False) == (
        "pallas/gpu:mosaic", "xla/gpu:cudnn", "triton/gpu:flash")
    assert order(jnp.bfloat16, 128) == order(jnp.bfloat16, 128, "fwd") == (
        "pallas/gpu:mosaic", "triton/gpu:flash", "xla/gpu:cudnn")
    assert order(jnp.bfloat16, 64) is None and order(jnp.float32, 128) is None


def test_the_h100_pack_trains_ssd_on_triton() -> None:
    h100 = _shipped("nvidia_h100")
    device = "gpu|NVIDIA_H100_80GB_HBM3|cc=9.0"

    def found(mode: str, dtype: Any) -> list[Any]:
        call = {"x": jax.ShapeDtypeStruct((1, 32768, 32, 128), dtype)}
        return [r for r in h100.rankings["ssd"] if r.orders(mode) and r.applies(device, call)]

    (training,) = found("fwd+bwd", jnp.bfloat16)
    assert training.order[0] == "triton/gpu:chunked"
    assert not found("fwd", jnp.bfloat16) and not found("fwd+bwd", jnp.float32)  # forward: the registry's order


def test_the_h100_pack_sends_d128_segment_ids_to_mosaic() -> None:
    h100 = _shipped("nvidia_h100")
    device = "gpu|NVIDIA_H100_80GB_HBM3|cc=9.0"
    q = jax.ShapeDtypeStruct((1, 32768, 16, 128), jnp.bfloat16)

    def first(mode: str, segments: Any, kv_heads: int = 16) -> str:
        k = jax.ShapeDtypeStruct((1, 32768, kv_heads, 128), jnp.bfloat16)
        call = {"q": q, "k": k, "q_segment_ids": segments, "sliding_window": None}
        return next(r for r in h100.rankings["flash_attention"] if r.orders(mode) and r.applies(device, call)).order[0]

    ids = jax.ShapeDtypeStruct((1, 32768), jnp.int32)
    assert first("fwd+bwd", ids) == "pallas/gpu:mosaic_segments" and first("fwd+bwd", None) == "xla/gpu:cudnn"
    assert first("fwd", ids) == "pallas/gpu:mosaic_segments" and first("fwd", None) == "pallas/gpu:mosaic"
    assert first("fwd", ids, kv_heads=4) == "triton/gpu:segments"  # GQA: Mosaic's segment forward not measured


@pytest.mark.parametrize(("name", "device"), [("nvidia_h100", "gpu|NVIDIA_H100_80GB_HBM3|cc=9.0"),
                                              ("nvidia_h200", "gpu|NVIDIA_H200|cc=9.0")])
def test_the_hopper_packs_send_chunked_prefill_and_decode_to_different_kernels(name: str, device: str) -> None:
    pack = _shipped(name)

    def first(q_rows: int) -> str:
        call = {"q": jax.ShapeDtypeStruct((q_rows, 32, 128), jnp.bfloat16),
                "kv_lens": jax.ShapeDtypeStruct((4,), jnp.int32)}
        return next(r for r in pack.rankings["ragged_paged_attention"] if r.applies(device, call)).order[0]

    assert first(4) == "pallas/gpu:triton_lowered"  # decode: one query per sequence
    assert first(4 * 256) == "triton/gpu:paged"  # chunked prefill


def test_the_h100_pack_runs_deepseek_prefill_on_the_mosaic_kernels() -> None:
    """q/k 192 with v 128 (DeepSeek's prefill): Mosaic GPU first, forward and forward+backward; q/k/v 192 (which it
    cannot run) and segment-id calls (which it refuses) keep cuDNN first."""
    h100 = _shipped("nvidia_h100")
    device = "gpu|NVIDIA_H100_80GB_HBM3|cc=9.0"

    def order(dv: int, mode: str) -> tuple[str, ...]:
        call = {"q": jax.ShapeDtypeStruct((4, 4096, 16, 192), jnp.bfloat16),
                "k": jax.ShapeDtypeStruct((4, 4096, 16, 192), jnp.bfloat16),
                "v": jax.ShapeDtypeStruct((4, 4096, 16, dv), jnp.bfloat16), "causal": True}
        return tuple(next(r for r in h100.rankings["flash_attention"] if r.orders(mode) and r.applies(device, call))
                     .order)

    assert order(128, "fwd")[:2] == order(128, "fwd+bwd")[:2] == ("pallas/gpu:mosaic", "xla/gpu:cudnn")
    assert order(192, "fwd")[0] == order(192, "fwd+bwd")[0] == "xla/gpu:cudnn"
