"""Shared fixtures: the real survey data in ../shared/data, used in place."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = (REPO / ".." / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data`` beside the repository (fails loudly when it is missing)."""
    assert DATA.is_dir(), f"survey data not found at {DATA}"
    return DATA


@pytest.fixture(scope="session")
def brighton_images(data_dir: Path) -> Path:
    return data_dir / "brighton_beach_1600" / "images"


@pytest.fixture(scope="session")
def seneca_images(data_dir: Path) -> Path:
    return data_dir / "seneca_1200" / "images"
