"""The height refinement solves only what the overlaps observe and keeps each block's own
heights (brighton ``--split 8 --split-overlap-m 0``: both submodels were lowered, -0.23 and
-0.42 m at their centres, and the merged DSM ended 0.52 m below ODM's cloud)."""

from __future__ import annotations

import numpy as np

from prefect_odm.align import AlignmentOptions, DemOverlap, align_heights
from prefect_odm.align.stages import refusals
from prefect_odm.merge.alignment_figures import alignment_lines

IDS = ["submodel-000", "submodel-001"]
E0, N0 = 576000.0, 5188000.0  # plan CRS metres, as brighton's UTM 15N
CENTRES = np.array([[E0 - 25.0, N0], [E0 + 25.0, N0]])


def _at_centres(result) -> list[float]:  # noqa: ANN001
    """Each submodel's height change at its own centre, metres."""
    out = []
    for t in result.transforms:
        p0, px, py = t.height_plane
        out.append(p0 + px * t.centre_m[0] + py * t.centre_m[1])
    return out


def _seam(half_width_m: float, dz) -> DemOverlap:  # noqa: ANN001
    """Samples on a seam along north at E0, ``half_width_m`` either side, 60 m long; ``dz(x, y)``
    (x, y relative to the seam's middle) the second's DSM minus the first's."""
    x, y = np.meshgrid(np.linspace(-half_width_m, half_width_m, 5), np.linspace(-30.0, 30.0, 61))
    x, y = x.ravel(), y.ravel()
    return DemOverlap(IDS[0], IDS[1], x + E0, y + N0, dz(x, y), None)


def test_a_thin_seam_leaves_the_tilt_across_it_unsolved() -> None:
    # submodel-001 lies 0.2 m above submodel-000 and the two DSMs' last metre differs by 0.05 m
    # per metre across the seam (an edge, not a tilt of either block); along the seam the second
    # rises 2 mm per metre more than the first (seen: 60 m of samples).
    overlap = _seam(1.0, lambda x, y: 0.2 + 0.05 * x + 0.002 * y)
    options = AlignmentOptions(refine_bowl=False)
    result = align_heights(IDS, CENTRES, [overlap], options)
    first, second = (t.height_plane for t in result.transforms)
    # across (east): not solved, so neither submodel is tilted that way (the old solve tilted
    # both by 25 mm/m, 1.4 deg, and so moved each 0.6 m at its centre)
    assert abs(first[1]) < 1e-4 and abs(second[1]) < 1e-4
    # along (north): the relative tilt the samples see, split between the two
    assert abs((first[2] - second[2]) - 0.002) < 2e-4
    # heights: 0.2 m apart, the block's mean at the submodels' own centres unchanged
    h0, h1 = _at_centres(result)
    assert abs((h0 - h1) - 0.2) < 0.01
    assert abs(h0 + h1) < 1e-6
    assert len(result.unsolved) == 1 and "across" in result.unsolved[0]
    lines = "\n".join(alignment_lines(_report(result)))
    assert "Not solved" in lines and "across" in lines


def test_a_wide_overlap_solves_the_tilt_and_keeps_the_block_height() -> None:
    # Both submodels truly tilt so that the seam is their highest part (a hinge): the relative
    # tilt across a 10 m band is observed and solved, and the gauge keeps the mean height
    # change at the two centres zero (the old gauge lowered both: -0.25 m each).
    overlap = _seam(5.0, lambda x, y: 0.02 * x)
    result = align_heights(IDS, CENTRES, [overlap], AlignmentOptions(refine_bowl=False))
    first, second = (t.height_plane for t in result.transforms)
    assert abs((first[1] - second[1]) - 0.02) < 1e-3
    h0, h1 = _at_centres(result)
    assert abs(h0 + h1) < 1e-6
    assert abs(h0 - h1) < 0.05  # the seam is their common ground: no relative height there
    assert result.unsolved == []
    assert refusals(result, AlignmentOptions()) == []


def test_a_correction_that_moves_the_block_height_is_refused() -> None:
    result = align_heights(IDS, CENTRES, [_seam(5.0, lambda x, y: 0.0 * x)])
    lowered = [
        t.model_copy(update={"translation_m": (0.0, 0.0, dz)})
        for t, dz in zip(result.transforms, (-0.23, -0.42), strict=True)
    ]
    bad = result.model_copy(update={"transforms": lowered})
    refused = refusals(bad, AlignmentOptions())
    assert [f.figure for f in refused] == ["max_block_height_change_m"]
    assert "submodel-000+submodel-001" in refused[0].message
    assert abs(refused[0].value - 0.325) < 1e-9


def _report(result):  # noqa: ANN001, ANN202
    from prefect_odm.align import AlignmentReport

    return AlignmentReport(result=result)
