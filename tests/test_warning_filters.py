"""The warning filters of a run that collects several distributions' tests together."""

from __future__ import annotations

import warnings

import pytest


def test_known_third_party_deprecations_stay_ignored() -> None:
    # pyproject ignores jax's deprecation of Pallas's Triton lowering (ejk-pallas's triton_lowered kernels use
    # it): this directory's "error" filter must not override that ignore, or every GPU test of ejk-pallas run
    # beside these tests fails on it.
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn("The Pallas Triton backend is deprecated and will be removed", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == []  # ignored, not recorded


def test_other_warnings_are_errors() -> None:
    with pytest.raises(UserWarning):
        warnings.warn("anything else", UserWarning, stacklevel=1)
