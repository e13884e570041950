"""The seamless orthophoto on synthetic surveys whose truth is known.

Nadir cameras 30 m above a textured plane; each image is rendered exactly (pinhole, no
distortion), then darkened by a known vignetting and a known gain per image, as a drone camera
with auto exposure does. The orthophoto must undo both, show no step where the view changes, never
take a view the DSM hides, and give the same pixels twice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prefect_odm.engine import ortho_labels, ortho_measures, ortho_views
from prefect_odm.engine.camera import CameraPose, Scene
from prefect_odm.engine.dem import HeightSampler
from prefect_odm.engine.ortho_radiometry import normalised_radius2
from prefect_odm.engine.orthophoto import OrthophotoResult, render_orthophoto_views
from prefect_odm.grid import Grid

from . import ortho_blocks

ALTITUDE_M = 30.0
NADIR = ((1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, -1.0))
"""World (east, north, up) to camera (right, down, forward): image top to the north."""

GAINS = (0.8, 1.0, 1.25, 0.9, 1.15, 1.05, 0.85, 1.2, 0.95)
VIGNETTING = (-0.25, -0.1)
"""True vignetting ``1 + a r^2 + b r^4`` (r: radius over the half diagonal): 0.65 at the corner."""


def _camera(name: str, x: float, y: float, width: int = 320, height: int = 240) -> CameraPose:
    return CameraPose(
        name, width, height, 300.0, width / 2, height / 2, 0.0, 0.0, NADIR, (x, y, ALTITUDE_M)
    )


def _texture(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Ground radiance (DN, 3 bands) at UTM-like metres: smooth patterns and sharp patches."""
    base = 120 + 30 * np.sin(x / 1.7) * np.cos(y / 2.3) + 15 * np.sin((x + 2 * y) / 0.6)
    # patch edges off the view grid's lines, so that no view boundary follows a texture edge
    patch = np.where((np.floor((x + 0.37) / 3.1) + np.floor((y + 0.53) / 2.1)) % 4 == 0, 25.0, 0.0)
    return np.stack([base + patch, 0.9 * base + patch, 0.8 * base + 10], axis=-1)


def _vignetting(r2: np.ndarray) -> np.ndarray:
    return 1 + VIGNETTING[0] * r2 + VIGNETTING[1] * r2 * r2


def _survey(folder: Path) -> Scene:
    """3 x 3 nadir images 10 m apart east and 8 m north, written as PNGs into ``folder``."""
    cameras = []
    for n, (i, j) in enumerate([(i, j) for j in range(3) for i in range(3)]):
        camera = _camera(f"img_{n}.png", 10.0 * i, 8.0 * j)
        v, u = np.mgrid[0 : camera.height, 0 : camera.width] + 0.5
        x = camera.center[0] + (u - camera.cx) / camera.focal_px * ALTITUDE_M
        y = camera.center[1] - (v - camera.cy) / camera.focal_px * ALTITUDE_M
        shade = GAINS[n] * _vignetting(normalised_radius2(camera, u, v))
        pixels = np.clip(_texture(x, y) * shade[..., None], 0, 255)
        Image.fromarray(np.rint(pixels).astype(np.uint8)).save(folder / camera.name)
        cameras.append(camera)
    return Scene("sfm", 32615, tuple(cameras), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), 9)


GRID = Grid(left=-8.0, top=24.0, resolution_m=0.1, width=360, height=320)


def _flat(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    return np.zeros(np.shape(rows))


@pytest.fixture(scope="module")
def survey(tmp_path_factory: pytest.TempPathFactory) -> tuple[Scene, Path, OrthophotoResult]:
    folder = tmp_path_factory.mktemp("synthetic")
    scene = _survey(folder)
    return scene, folder, render_orthophoto_views(scene, folder, GRID, _flat, log=lambda _: None)


def _truth_grey() -> np.ndarray:
    """The true radiance (mean of the bands) of every orthophoto cell."""
    x = GRID.left + (np.arange(GRID.width) + 0.5) * GRID.resolution_m
    y = GRID.top - (np.arange(GRID.height) + 0.5) * GRID.resolution_m
    xx, yy = np.meshgrid(x, y)
    return _texture(xx, yy).mean(axis=-1)


def _truth_ratio(rgba: np.ndarray) -> np.ndarray:
    """Orthophoto grey over the true radiance's, at the coloured cells."""
    return (ortho_measures.grey(rgba) / _truth_grey())[rgba[3] > 0]


def test_vignetting_and_exposure_are_compensated(
    survey: tuple[Scene, Path, OrthophotoResult],
) -> None:
    scene, folder, result = survey
    radiometry = result.radiometry
    # the vignetting at the image corner (r = 1) and the gains (up to one common factor)
    solved_corner = np.exp(radiometry.vignetting[0, 0].sum())
    assert solved_corner == pytest.approx(_vignetting(np.array(1.0)), rel=0.03)
    ratio = radiometry.gains[:, 0] / np.asarray(GAINS)
    assert ratio.std() / ratio.mean() < 0.02, f"gains off the truth by {ratio}"
    # the orthophoto is the true radiance times one constant; uncorrected it is not
    spread = np.std(_truth_ratio(result.rgba)) / np.mean(_truth_ratio(result.rgba))
    raw = render_orthophoto_views(scene, folder, GRID, _flat, compensate=False, log=lambda _: None)
    raw_spread = np.std(_truth_ratio(raw.rgba)) / np.mean(_truth_ratio(raw.rgba))
    assert spread < 0.01, f"compensated orthophoto / truth varies by {spread:.3f}"
    assert raw_spread > 2 * spread, f"uncompensated {raw_spread:.3f} vs {spread:.3f}"


def test_view_boundaries_leave_no_step(survey: tuple[Scene, Path, OrthophotoResult]) -> None:
    scene, folder, result = survey
    labels = result.labels[
        np.ix_(
            np.arange(GRID.height) // result.views.factor,
            np.arange(GRID.width) // result.views.factor,
        )
    ]
    assert len(np.unique(labels[labels >= 0])) >= 4, "the test needs several views"
    ours = ortho_measures.step_ratio(result.rgba, *ortho_measures.label_edges(labels))
    # the block renderer cuts between the same differently exposed images: the measure sees it
    old = ortho_blocks.render_orthophoto_blocks(scene, folder, GRID, _flat, log=lambda _: None)
    block = ortho_blocks.SELECTION_BLOCK
    old_labels = np.repeat(
        np.repeat(ortho_blocks.best_cameras(scene, GRID, _flat), block, 0), block, 1
    )
    theirs = ortho_measures.step_ratio(
        old, *ortho_measures.label_edges(old_labels[: GRID.height, : GRID.width])
    )
    assert theirs > 1.2, f"the block renderer's view-boundary step ratio is {theirs:.3f}"
    # against the true radiance's step ratio on the same edges (the texture's own share)
    truth = np.clip(np.rint(_truth_grey()), 0, 255).astype(np.uint8)
    truth_rgba = np.stack([truth, truth, truth, result.rgba[3]])
    texture = ortho_measures.step_ratio(truth_rgba, *ortho_measures.label_edges(labels))
    assert ours <= 1.02 * texture, f"view-boundary step ratio {ours:.3f} (truth {texture:.3f})"


def test_same_input_gives_the_same_pixels(survey: tuple[Scene, Path, OrthophotoResult]) -> None:
    scene, folder, result = survey
    again = render_orthophoto_views(scene, folder, GRID, _flat, log=lambda _: None)
    assert np.array_equal(again.rgba, result.rgba)
    assert np.array_equal(again.labels, result.labels)


def _east_and_west() -> tuple[Scene, Grid]:
    """Two nadir cameras, 15 m east and 20 m west of x = 0, and a 16 x 12 m grid around it."""
    east = _camera("east.png", 15.0, 0.0, width=640, height=480)
    west = _camera("west.png", -20.0, 0.0, width=640, height=480)
    scene = Scene("sfm", 32615, (east, west), np.zeros((0, 3)), np.zeros((0, 3), np.uint8), 2)
    return scene, Grid(left=-4.0, top=6.0, resolution_m=0.1, width=160, height=120)


def _x_m(grid: Grid, cols: np.ndarray) -> np.ndarray:
    """Easting of the centres of columns ``cols`` of ``grid``."""
    return grid.left + (np.asarray(cols) + 0.5) * grid.resolution_m


def test_a_view_the_dsm_hides_is_not_chosen() -> None:
    """A 10 m wall at 4 <= x <= 6 m hides the ground just west of it from the camera east of it
    (15 m off, the more nadir view there); the camera 20 m west must colour it instead."""
    scene, grid = _east_and_west()

    def wall(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        x = _x_m(grid, cols)
        return np.where((x >= 4.0) & (x <= 6.0), 10.0, 0.0)

    def chosen(height_at: HeightSampler) -> np.ndarray:
        views = ortho_views.candidate_views(scene, grid, height_at)
        labels, _ = ortho_labels.label_views(views, np.zeros(views.camera.shape, np.float32))
        x = _x_m(views.grid, np.arange(views.grid.width))
        return labels[:, (x > 0.5) & (x < 3.0)]

    # without the wall the eastern camera wins there (so the test can fail) ...
    assert (chosen(_flat) == 0).all()
    # ... with it, the western one does
    assert (chosen(wall) == 1).all()


def test_a_cell_every_camera_has_hidden_takes_its_least_hidden_view() -> None:
    """A 1 m trench between two 10 m walls (x from 0 to 3 m) is hidden from both cameras, 15 m
    east and 20 m west: its floor takes the cheaper (eastern) occluded view instead of staying a
    hole in the orthophoto; open ground that one camera sees keeps that visible view alone."""
    scene, grid = _east_and_west()

    def trench(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        x = _x_m(grid, cols)
        return np.where(((x >= 0.0) & (x < 1.0)) | ((x > 2.0) & (x <= 3.0)), 10.0, 0.0)

    views = ortho_views.candidate_views(scene, grid, trench)
    x = _x_m(views.grid, np.arange(views.grid.width))
    floor = (x > 1.2) & (x < 1.8)
    # hidden from both: one candidate, the eastern camera (more nadir), none behind it
    assert (views.camera[0][:, floor] == 0).all()
    assert (views.camera[1][:, floor] == -1).all()
    assert np.isfinite(views.cost[0][:, floor]).all()
    # open ground west of the walls: the walls hide it from the east, the west camera sees it
    open_west = (x > -3.0) & (x < -1.0)
    assert (views.camera[0][:, open_west] == 1).all()
    assert (views.camera[1][:, open_west] == -1).all()
