"""KernelRegistry: registration, lookup order and fallbacks, errors, listing, signature checks."""

from __future__ import annotations

import warnings
from typing import Any

import attrs
import jax
import pytest

import ejk
from ejk import Backend, KernelRegistry, KernelSpec, Platform
from ejk.errors import DuplicateKernelError, EjkError, KernelNotFoundError
from ejk.plugins import PlatformStatus, PluginHost

DEFAULT = Backend(jax.default_backend())


def impl_a(x: Any) -> str:
    return "a"


def impl_b(x: Any) -> str:
    return "b"


def impl_c(x: Any) -> str:
    return "c"


@pytest.fixture
def registry() -> KernelRegistry:
    return KernelRegistry()


# -- registration and priority --------------------------------------------------------------------


def test_register_returns_function_unchanged_and_get_finds_it(registry: KernelRegistry) -> None:
    decorated = registry.register("my_op", Platform.TRITON, Backend.GPU)(impl_a)
    assert decorated is impl_a
    assert registry.get("my_op", platform="triton", backend="gpu") is impl_a
    assert registry.get("my_op") is impl_a


def test_highest_priority_wins_regardless_of_registration_order(registry: KernelRegistry) -> None:
    registry.register("my_op", "triton", "gpu", priority=1)(impl_a)
    registry.register("my_op", "pallas", "gpu", priority=10)(impl_b)
    registry.register("my_op", "xla", "any", priority=5)(impl_c)
    assert registry.get("my_op") is impl_b
    assert registry.get("my_op", backend="gpu") is impl_b
    assert registry.get("my_op", platform="triton") is impl_a
    assert registry.get("my_op", backend="tpu") is impl_c  # only the ANY one matches a TPU query
    assert [s.implementation for s in registry.list_implementations("my_op")] == [impl_b, impl_c, impl_a]


def test_equal_priorities_keep_registration_order(registry: KernelRegistry) -> None:
    registry.register("my_op", "triton", "gpu")(impl_a)
    registry.register("my_op", "pallas", "gpu")(impl_b)
    assert registry.get("my_op", backend="gpu") is impl_a
    assert [s.platform for s in registry.list_implementations("my_op")] == ["triton", "pallas"]


def test_names_are_case_insensitive(registry: KernelRegistry) -> None:
    registry.register("My_Attention", "TRITON", "GPU")(impl_a)  # not a defined op: no call contract
    assert registry.list_algorithms() == ["my_attention"]
    assert registry.get("MY_ATTENTION", platform="Triton", backend="Gpu") is impl_a
    assert registry.get("my_attention", platform=Platform.TRITON, backend=Backend.GPU) is impl_a
    spec = registry.get_spec("my_attention")
    assert spec.algorithm == "my_attention"
    assert spec.platform is Platform.TRITON
    assert spec.backend is Backend.GPU


def test_cuda_and_rocm_backend_names_mean_gpu(registry: KernelRegistry) -> None:
    registry.register("my_op", "triton", "cuda")(impl_a)
    assert registry.get_spec("my_op").backend is Backend.GPU
    assert registry.get("my_op", backend="rocm") is impl_a


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"algorithm": "", "platform": "xla", "backend": "cpu"}, "algorithm"),
    ({"algorithm": "op", "platform": "not a name!", "backend": "cpu"}, "platform"),
    ({"algorithm": "op", "platform": "xla", "backend": "fpga"}, "backend"),
    ({"algorithm": "op", "platform": "xla", "backend": "cpu", "priority": 1.5}, "priority"),
])
def test_register_rejects_bad_arguments(registry: KernelRegistry, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        registry.register(**kwargs)


def test_register_rejects_non_callables(registry: KernelRegistry) -> None:
    with pytest.raises(TypeError, match="callable"):
        registry.register("op", "xla", "cpu")(42)  # type: ignore[type-var]


# -- matching and fallbacks -----------------------------------------------------------------------


def test_backend_any_implementation_matches_every_backend(registry: KernelRegistry) -> None:
    registry.register("my_op", "xla", Backend.ANY)(impl_a)
    for backend in ("gpu", "tpu", "cpu", "any"):
        assert registry.get("my_op", platform="xla", backend=backend) is impl_a
    assert registry.get("my_op", backend="tpu") is impl_a


def test_specific_backend_does_not_match_another(registry: KernelRegistry) -> None:
    registry.register("my_op", "triton", "gpu")(impl_a)
    with pytest.raises(KernelNotFoundError):
        registry.get("my_op", platform="triton", backend="tpu")


def test_xla_falls_back_through_any_to_the_default_backend(registry: KernelRegistry) -> None:
    # xla/<other backend> -> xla/any -> xla/<jax.default_backend()>
    registry.register("my_op", "xla", DEFAULT)(impl_a)
    other = Backend.TPU if DEFAULT is not Backend.TPU else Backend.GPU
    assert registry.get("my_op", platform="xla", backend=other) is impl_a
    # The fallback is XLA's only: a portable platform; others do not silently change backend.
    registry.register("my_op", "pallas", DEFAULT)(impl_b)
    with pytest.raises(KernelNotFoundError):
        registry.get("my_op", platform="pallas", backend=other)


def test_backend_any_query_falls_back_to_default_backend(registry: KernelRegistry) -> None:
    registry.register("my_op", "triton", DEFAULT)(impl_a)
    assert registry.get("my_op", platform="triton", backend="any") is impl_a
    other = Backend.TPU if DEFAULT is not Backend.TPU else Backend.GPU
    registry.register("other_op", "triton", other)(impl_b)
    with pytest.raises(KernelNotFoundError):
        registry.get("other_op", platform="triton", backend="any")


def test_backend_any_query_prefers_any_implementations(registry: KernelRegistry) -> None:
    registry.register("my_op", "xla", DEFAULT, priority=10)(impl_a)
    registry.register("my_op", "xla", "any", priority=0)(impl_b)
    assert registry.get("my_op", platform="xla", backend="any") is impl_b


@pytest.mark.parametrize("platform", ["xla", Platform.XLA, "triton", None, "auto"])
@pytest.mark.parametrize("backend", [None, "any", "gpu", "cpu", "tpu"])
def test_no_infinite_recursion_when_nothing_matches(registry: KernelRegistry, platform: Any, backend: Any) -> None:
    with pytest.raises(KernelNotFoundError):
        registry.get("missing_op", platform=platform, backend=backend)
    # Something registered, but never for the queried platform: each fallback is tried once.
    registry.register("present_op", "cute", "gpu")(impl_a)
    if platform is not None:
        with pytest.raises(KernelNotFoundError):
            registry.get("present_op", platform="xla" if platform == "auto" else platform, backend=backend)


class FamilyHints:
    """A plugin that knows which distributions provide other platforms (as ejk-xla does)."""

    @ejk.hookimpl
    def ejk_platform_distributions(self) -> dict[str, str]:
        return {"cute": "ejk-cute", "triton": "ejk-triton"}


def test_kernel_not_found_is_a_value_error_listing_what_is_registered(registry: KernelRegistry) -> None:
    PluginHost(registry, load_entry_points=False).register_plugin(FamilyHints(), "family")
    registry.register("my_op", "triton", "gpu", priority=3)(impl_a)
    registry.register("my_op", "pallas", "tpu")(impl_b)
    with pytest.raises(ValueError, match="my_op") as excinfo:
        registry.get("my_op", platform="cute", backend="gpu")
    assert isinstance(excinfo.value, KernelNotFoundError)
    assert isinstance(excinfo.value, EjkError)
    message = str(excinfo.value)
    assert "triton/gpu" in message
    assert "pallas/tpu" in message
    assert "priority 3" in message
    assert "pip install ejk-cute" in message  # what to install for the missing platform


def test_kernel_not_found_for_unknown_algorithm_lists_algorithms(registry: KernelRegistry) -> None:
    registry.register("my_matmul", "xla", "any")(impl_a)  # toy algorithms: no op's call contract applies
    registry.register("my_attention", "xla", "any")(impl_a)
    with pytest.raises(KernelNotFoundError) as excinfo:
        registry.get("not_an_op")
    message = str(excinfo.value)
    assert "'not_an_op'" in message
    assert "my_attention, my_matmul" in message
    assert "pip install ejk-xla" in message


def test_kernel_not_found_names_skipped_plugins_with_reason_and_fix(registry: KernelRegistry) -> None:
    host = PluginHost(registry, load_entry_points=False)

    class Broken:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            raise ImportError("No module named 'some_toolkit'")

    with pytest.warns(RuntimeWarning, match="broken"):
        host.register_plugin(Broken(), "broken", distribution="ejk-broken", version="0.3")
    host.register_plugin(FamilyHints(), "family")
    with pytest.raises(KernelNotFoundError) as excinfo:
        registry.get("flash_attention", platform="triton")
    message = str(excinfo.value)
    assert "Plugin broken (ejk-broken) was failed" in message
    assert "some_toolkit" in message
    assert "Fix:" in message
    assert "EJK_DISABLE_PLUGINS=broken" in message
    assert "pip install ejk-triton" in message


def test_install_hints_come_from_plugins_not_from_core(registry: KernelRegistry) -> None:
    def message(platform: str) -> str:
        with pytest.raises(KernelNotFoundError) as excinfo:
            registry.get("my_op", platform=platform)
        return str(excinfo.value)

    registry.register("my_op", "xla", "any")(impl_a)
    assert "pip install" not in message("cute")  # no plugin says which distribution provides cute
    host = PluginHost(registry, load_entry_points=False)

    class Serves:
        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform="gizmo", available=False, reason="no gizmo here")

    host.register_plugin(Serves(), "gizmo-plugin", distribution="gizmo-kernels")
    assert "To add the gizmo platform: pip install gizmo-kernels" in message("gizmo")  # its own platform
    assert "pip install" not in message("cute")
    host.register_plugin(FamilyHints(), "family")
    assert "To add the cute platform: pip install ejk-cute" in message("cute")  # another plugin's hint

    class Bad:
        @ejk.hookimpl
        def ejk_platform_distributions(self) -> Any:
            return ["ejk-cute"]

    with pytest.warns(RuntimeWarning, match="ejk_platform_distributions returned list"):
        host.register_plugin(Bad(), "bad")
        message("cute")
    assert any("ejk_platform_distributions" in e for e in host.plugins["bad"].hook_errors)


# -- platform="auto" ------------------------------------------------------------------------------


def _status_plugin(platform: str, available: bool, reason: str | None = None, fix: str | None = None) -> object:
    class StatusPlugin:
        @ejk.hookimpl
        def ejk_platform_status(self) -> PlatformStatus:
            return PlatformStatus(platform=platform, available=available, reason=reason, fix=fix)

    return StatusPlugin()


def test_auto_skips_platforms_whose_status_is_unavailable(registry: KernelRegistry) -> None:
    host = PluginHost(registry, load_entry_points=False)
    host.register_plugin(_status_plugin("triton", False, "triton is not installed"), "triton-status")
    host.register_plugin(_status_plugin("xla", True), "xla-status")
    registry.register("my_op", "triton", "any", priority=100)(impl_a)
    registry.register("my_op", "xla", "any", priority=0)(impl_b)
    assert registry.get("my_op", platform="auto") is impl_b
    assert registry.get("my_op") is impl_a  # platform=None does not consult availability
    assert registry.platform_available("triton") == (False, "triton is not installed")
    assert registry.platform_available("xla") == (True, None)
    assert registry.platform_available("unknown_platform") == (True, None)


def test_auto_uses_the_default_backend(registry: KernelRegistry) -> None:
    other = Backend.TPU if DEFAULT is not Backend.TPU else Backend.GPU
    registry.register("my_op", "pallas", other, priority=100)(impl_a)
    registry.register("my_op", "xla", DEFAULT)(impl_b)
    assert registry.get("my_op", platform="AUTO") is impl_b
    assert registry.get("my_op", platform="auto", backend=other) is impl_a


def test_auto_with_nothing_available_explains_why(registry: KernelRegistry) -> None:
    host = PluginHost(registry, load_entry_points=False)
    host.register_plugin(_status_plugin("triton", False, "jax-triton not installed", "pip install jax-triton"),
                         "triton-status")
    registry.register("my_op", "triton", "any")(impl_a)
    with pytest.raises(KernelNotFoundError) as excinfo:
        registry.get("my_op", platform="auto")
    message = str(excinfo.value)
    assert "platform=auto" in message
    assert "Platform 'triton' is unavailable: jax-triton not installed. Fix: pip install jax-triton" in message


# -- duplicates -----------------------------------------------------------------------------------


def test_duplicate_registration_names_both_registrants(registry: KernelRegistry) -> None:
    registry.register("my_op", "triton", "gpu")(impl_a)
    with pytest.raises(DuplicateKernelError) as excinfo:
        registry.register("MY_OP", "Triton", "GPU", priority=5)(impl_b)
    message = str(excinfo.value)
    assert isinstance(excinfo.value, ValueError)
    assert f"{__name__}.impl_a" in message
    assert f"{__name__}.impl_b" in message
    assert [s.implementation for s in registry.list_implementations("my_op")] == [impl_a]


def _label_plugin(fn: Any, priority: int, extra: Any = None) -> object:
    class P:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("my_op", "triton", "gpu", priority=priority)(fn)
            if extra is not None:
                register("my_op", "triton", "gpu", name="own")(extra)

    return P()


def test_a_label_taken_by_another_plugin_is_refused_and_reported(registry: KernelRegistry) -> None:
    host = PluginHost(registry, load_entry_points=False)
    host.register_plugin(_label_plugin(impl_a, 1), "first")
    with pytest.warns(RuntimeWarning, match="plugin first already registered triton/gpu"):
        second = host.register_plugin(_label_plugin(impl_b, 50, extra=impl_c), "second")
    assert registry.get_spec("my_op", "triton", "gpu", name="triton").implementation is impl_a  # never silently won
    assert [(s.name, s.plugin.name) for s in registry.list_implementations("my_op") if s.plugin] == [
        ("triton", "first"), ("own", "second")]  # the rest of the squatting plugin still loads
    assert second.status == "loaded"
    assert any("my_op triton/gpu of plugin second" in e and "refused" in e for e in second.hook_errors)
    assert not host.plugins["first"].hook_errors


def test_a_label_taken_outside_a_plugin_raises(registry: KernelRegistry) -> None:
    registry.register("my_op", "triton", "gpu")(impl_a)
    host = PluginHost(registry, load_entry_points=False)
    with pytest.warns(RuntimeWarning, match="plugin <none> already registered"):
        host.register_plugin(_label_plugin(impl_b, 1), "late")
    assert registry.get("my_op", platform="triton", backend="gpu") is impl_a


def test_duplicate_inside_a_plugin_fails_that_plugin_and_rolls_back(registry: KernelRegistry) -> None:
    host = PluginHost(registry, load_entry_points=False)

    class Twice:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("other_op", "xla", "any")(impl_c)
            register("my_op", "triton", "gpu")(impl_a)
            register("my_op", "triton", "gpu")(impl_b)

    with pytest.warns(RuntimeWarning, match="registered twice"):
        info = host.register_plugin(Twice(), "twice")
    assert info.status == "failed"
    assert "impl_a" in (info.error or "") and "impl_b" in (info.error or "")
    assert "rolled back" in (info.error or "")
    assert registry.list_algorithms() == []


# -- listing --------------------------------------------------------------------------------------


def test_list_algorithms_is_sorted_and_lowercase(registry: KernelRegistry) -> None:
    assert registry.list_algorithms() == []
    registry.register("Zeta", "xla", "any")(impl_a)
    registry.register("alpha", "xla", "any")(impl_a)
    registry.register("alpha", "triton", "gpu")(impl_b)
    assert registry.list_algorithms() == ["alpha", "zeta"]


def test_list_implementations_is_a_copy_in_priority_order(registry: KernelRegistry) -> None:
    registry.register("my_op", "xla", "any", priority=-1)(impl_a)
    registry.register("my_op", "triton", "gpu", priority=7)(impl_b)
    registry.register("my_op", "pallas", "tpu", priority=3)(impl_c)
    specs = registry.list_implementations("MY_OP")
    assert [s.priority for s in specs] == [7, 3, -1]
    assert all(isinstance(s, KernelSpec) for s in specs)
    specs.clear()
    assert len(registry.list_implementations("my_op")) == 3
    assert registry.list_implementations("unknown") == []
    assert [s.algorithm for s in registry] == ["my_op"] * 3


# -- KernelSpec -----------------------------------------------------------------------------------


def test_kernel_spec_is_frozen_and_hashable(registry: KernelRegistry) -> None:
    registry.register("my_op", "xla", "any", priority=2)(impl_a)
    spec = registry.get_spec("my_op")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.priority = 100  # type: ignore[misc]
    assert hash(spec) == hash(registry.get_spec("my_op"))
    assert spec.label == "xla/any"
    assert spec.plugin is None  # registered outside any plugin


def test_kernel_spec_records_the_registering_plugin(registry: KernelRegistry) -> None:
    host = PluginHost(registry, load_entry_points=False)

    @attrs.frozen
    class MyCfg:
        block: int = 64

    class Mine:
        @ejk.hookimpl
        def ejk_register_kernels(self, register: Any) -> None:
            register("my_op", "mykernels", "gpu", priority=4, cfg_type=MyCfg)(impl_a)

    host.register_plugin(Mine(), "Mine", distribution="ejk-mykernels", version="1.2.3")
    spec = registry.get_spec("my_op")
    assert spec.plugin is not None
    assert spec.plugin.name == "mine"
    assert spec.plugin.distribution == "ejk-mykernels"
    assert spec.plugin.version == "1.2.3"
    assert str(spec.plugin) == "mine (ejk-mykernels 1.2.3)"
    assert spec.cfg_type is MyCfg
    assert spec.priority == 4
    # Registrations made after the hook returned are not attributed to the plugin.
    registry.register("late_op", "xla", "any")(impl_b)
    assert registry.get_spec("late_op").plugin is None


# -- third-party platforms ------------------------------------------------------------------------


def test_third_party_platform_names(registry: KernelRegistry) -> None:
    registry.register("my_op", "MyKernels", "gpu", priority=1)(impl_a)
    registry.register("my_op", "my-other_kernels", "any")(impl_b)
    spec = registry.get_spec("my_op", platform="mykernels")
    assert spec.platform == "mykernels"
    assert not isinstance(spec.platform, Platform)
    assert registry.get("my_op", platform="MY-OTHER_KERNELS", backend="tpu") is impl_b
    with pytest.raises(KernelNotFoundError) as excinfo:
        registry.get("my_op", platform="third")
    assert "pip install" not in str(excinfo.value).split("Registered")[0]


def test_known_platforms_are_enum_members(registry: KernelRegistry) -> None:
    registry.register("my_op", "cute", "gpu")(impl_a)
    assert registry.get_spec("my_op").platform is Platform.CUTE
    assert {p.value for p in Platform} == {"triton", "pallas", "cuda", "cute", "xla"}
    assert {b.value for b in Backend} == {"gpu", "tpu", "cpu", "any"}


# -- validate_signatures --------------------------------------------------------------------------


def reference(q: jax.Array, k: jax.Array, *, causal: bool = False, cfg: Any = None) -> jax.Array:
    return q


def same(q: jax.Array, k: jax.Array, *, causal: bool = False, cfg: int | None = None) -> jax.Array:
    return q


def renamed(q: jax.Array, key: jax.Array, *, causal: bool = False, cfg: Any = None) -> jax.Array:
    return q


def other_kind(q: jax.Array, k: jax.Array, causal: bool = False, *, cfg: Any = None) -> jax.Array:
    return q


def other_default(q: jax.Array, k: jax.Array, *, causal: bool = True, cfg: Any = None) -> jax.Array:
    return q


def other_annotation(q: jax.Array, k: int, *, causal: bool = False, cfg: Any = None) -> jax.Array:
    return q


def _validate(registry: KernelRegistry, algorithm: str | None) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = registry.validate_signatures(algorithm)
    assert all(issubclass(w.category, UserWarning) for w in caught)
    return result, [str(w.message) for w in caught]


def test_validate_signatures_true_when_all_match(registry: KernelRegistry) -> None:
    registry.register("attn", "xla", "any", priority=10)(reference)
    registry.register("attn", "triton", "gpu")(same)  # a different cfg annotation is fine
    assert _validate(registry, "attn") == (True, [])


@pytest.mark.parametrize(("impl", "needle"), [
    (renamed, "parameter 'key' where 'k' is expected"),
    (other_kind, "parameter 'causal' is positional or keyword, expected keyword-only"),
    (other_default, "parameter 'causal' defaults to True, expected False"),
    (other_annotation, "parameter 'k' is annotated int, expected jax.Array"),
])
def test_validate_signatures_reports_each_mismatch(registry: KernelRegistry, impl: Any, needle: str) -> None:
    registry.register("attn", "xla", "any", priority=10)(reference)
    registry.register("attn", "triton", "gpu")(impl)
    result, messages = _validate(registry, "attn")
    assert result is False
    assert len(messages) == 1, messages
    assert needle in messages[0]
    assert "triton/gpu" in messages[0] and impl.__name__ in messages[0]


def test_validate_signatures_warns_once_per_mismatch(registry: KernelRegistry) -> None:
    def many(q: int, key: jax.Array, causal: bool = True, *, cfg: Any = None) -> jax.Array:
        return q  # type: ignore[return-value]

    registry.register("attn", "xla", "any", priority=10)(reference)
    registry.register("attn", "triton", "gpu")(many)
    result, messages = _validate(registry, "attn")
    assert result is False
    assert len(messages) == 4, messages  # q annotation; k renamed; causal kind; causal default
    assert any("'q' is annotated int" in m for m in messages)
    assert any("'key' where 'k'" in m for m in messages)
    assert any("'causal' is positional or keyword" in m for m in messages)
    assert any("'causal' defaults to True" in m for m in messages)


def test_validate_signatures_reports_a_different_parameter_count(registry: KernelRegistry) -> None:
    def fewer(q: jax.Array, k: jax.Array, *, causal: bool = False) -> jax.Array:
        return q

    registry.register("attn", "xla", "any", priority=10)(reference)
    registry.register("attn", "triton", "gpu")(fewer)
    result, messages = _validate(registry, "attn")
    assert result is False
    assert any("3 parameters instead of 4" in m for m in messages)


def test_validate_signatures_unknown_algorithm(registry: KernelRegistry) -> None:
    registry.register("attn", "xla", "any")(reference)
    with pytest.raises(ValueError, match="'nope' is not registered; registered: attn"):
        registry.validate_signatures("nope")


def test_validate_signatures_for_all_algorithms(registry: KernelRegistry) -> None:
    registry.register("attn", "xla", "any", priority=10)(reference)
    registry.register("attn", "triton", "gpu")(other_default)
    registry.register("good", "xla", "any", priority=10)(reference)
    registry.register("good", "triton", "gpu")(same)
    result, messages = _validate(registry, None)
    assert result is False  # one algorithm disagrees
    assert len(messages) == 1 and messages[0].startswith("attn:")
    assert _validate(registry, "good") == (True, [])


def test_validate_signatures_verbose_prints(registry: KernelRegistry, capsys: pytest.CaptureFixture[str]) -> None:
    registry.register("attn", "xla", "any")(reference)
    assert registry.validate_signatures("attn", verbose=True) is True
    assert "attn xla/any" in capsys.readouterr().out


# -- loading -------------------------------------------------------------------------------------


def test_loader_runs_once_on_first_query() -> None:
    calls: list[KernelRegistry] = []

    def loader(reg: KernelRegistry) -> None:
        calls.append(reg)
        reg.register("loaded_op", "xla", "any")(impl_a)
        assert reg.list_algorithms() == ["loaded_op"]  # a re-entrant query does not recurse

    reg = KernelRegistry(loader=loader)
    assert calls == []
    assert reg.get("loaded_op") is impl_a
    assert reg.list_algorithms() == ["loaded_op"]
    assert calls == [reg]

