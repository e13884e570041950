"""The memory model: anchors reproduced, monotonic, options, inverse."""

from __future__ import annotations

import pytest

from prefect_odm.errors import InputError
from prefect_odm.plan.memory import (
    ODM_DOCUMENTED_MINIMUM_GIB,
    REFERENCE_MEGAPIXELS,
    SCALEODM_MEASURED_PEAKS_GIB,
    estimate_peak_memory_gib,
    max_images_within,
)


@pytest.mark.parametrize(("images", "gib"), ODM_DOCUMENTED_MINIMUM_GIB)
def test_odm_documented_anchors(images: int, gib: float) -> None:
    assert estimate_peak_memory_gib(images, REFERENCE_MEGAPIXELS) == pytest.approx(gib, abs=0.01)


@pytest.mark.parametrize(("images", "gib"), SCALEODM_MEASURED_PEAKS_GIB)
def test_scaleodm_anchors(images: int, gib: float) -> None:
    assert estimate_peak_memory_gib(
        images, REFERENCE_MEGAPIXELS, model="scaleodm"
    ) == pytest.approx(gib, abs=0.01)


def test_scaleodm_linear_fit_holds_in_its_range() -> None:
    # ScaleODM: "~0.042*images + 16 GiB"; within 3 GiB from 200 to 2500 images.
    for n in (200, 500, 1000, 1500, 2500):
        assert estimate_peak_memory_gib(n, REFERENCE_MEGAPIXELS, model="scaleodm") == pytest.approx(
            0.042 * n + 16, abs=3.0
        )


def test_interpolates_and_extrapolates() -> None:
    mid = estimate_peak_memory_gib(1000, REFERENCE_MEGAPIXELS)
    assert 32 < mid < 64
    assert estimate_peak_memory_gib(6000, REFERENCE_MEGAPIXELS) > 256


@pytest.mark.parametrize("model", ["odm", "scaleodm", "builtin"])
def test_monotonic_in_images_and_pixels(model: str) -> None:
    values = [estimate_peak_memory_gib(n, 12.0, model=model) for n in range(1, 3000, 37)]
    assert values == sorted(values)
    assert estimate_peak_memory_gib(200, 20.0, model=model) > estimate_peak_memory_gib(
        200, 5.0, model=model
    )


def test_options_change_the_estimate() -> None:
    base = estimate_peak_memory_gib(300, 12.0, {})
    assert estimate_peak_memory_gib(300, 12.0, {"pc-quality": "ultra"}) > base
    assert estimate_peak_memory_gib(300, 12.0, {"fast-orthophoto": True}) < base
    with pytest.raises(InputError, match="pc-quality"):
        estimate_peak_memory_gib(300, 12.0, {"pc-quality": "extreme"})


def test_bad_arguments() -> None:
    assert estimate_peak_memory_gib(0, 12.0) == 0.0
    with pytest.raises(InputError):
        estimate_peak_memory_gib(-1, 12.0)
    with pytest.raises(InputError):
        estimate_peak_memory_gib(10, 0.0)
    with pytest.raises(InputError):
        estimate_peak_memory_gib(10, 12.0, model="nope")  # type: ignore[arg-type]


def test_max_images_within_is_the_inverse() -> None:
    n = max_images_within(32.0, 12.0)
    assert estimate_peak_memory_gib(n, 12.0) <= 32.0 < estimate_peak_memory_gib(n + 1, 12.0)
    assert n == 500
    assert max_images_within(0.5, 12.0) == 0
