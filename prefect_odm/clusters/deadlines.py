"""How long a submodel may run on its node before it is cancelled as timed out (pure).

The time model is the memory model's companion: processing time grows with the pixels a node
processes, ``image_count * megapixels``, at a rate per engine:

* ``builtin``: :data:`BUILTIN_SECONDS_PER_IMAGE_MEGAPIXEL`, measured on brighton with the
  ``direct`` pipeline on 2 loaded cores (submodels of 9-12 images of 1.44 MP processed in
  12.5-13.9 s, ``manifest.json``'s ``phase_seconds.processing``: 0.8-1.0 s per image-MP),
  rounded up to 2 s for ``sfm`` and dense matching;
* ``odm``: :data:`ODM_SECONDS_PER_IMAGE_MEGAPIXEL`, an assumption (OpenDroneMap publishes no
  processing-time table): ~2 minutes per 12 MP photo.

The deadline is ``slack_factor`` times that, bounded by ``min_seconds`` below (a small
submodel still gets a node's start-up and a slow download) and ``max_seconds`` above (six hours,
the Kubernetes job template's default ``activeDeadlineSeconds``). An explicit timeout replaces
the model, still bounded below by one second.
"""

from __future__ import annotations

from dataclasses import dataclass

BUILTIN_SECONDS_PER_IMAGE_MEGAPIXEL = 2.0
"""Built-in engine processing time per image-megapixel, seconds (see the module)."""

ODM_SECONDS_PER_IMAGE_MEGAPIXEL = 10.0
"""OpenDroneMap processing time per image-megapixel, seconds (an assumption, see the module)."""

SLACK_FACTOR = 4.0
"""A submodel may take this many times its modelled time."""

MIN_DEADLINE_SECONDS = 600.0
MAX_DEADLINE_SECONDS = 6 * 3600.0


@dataclass(frozen=True)
class DeadlineRule:
    """The time model's rate and bounds (see the module)."""

    seconds_per_image_megapixel: float = ODM_SECONDS_PER_IMAGE_MEGAPIXEL
    slack_factor: float = SLACK_FACTOR
    min_seconds: float = MIN_DEADLINE_SECONDS
    max_seconds: float = MAX_DEADLINE_SECONDS

    @classmethod
    def for_engine(cls, engine_identity: str) -> DeadlineRule:
        """The rule of the engine a plan was made for (the built-in engine's own rate for
        ``prefect-odm-engine ...``)."""
        if engine_identity.startswith("prefect-odm-engine"):
            return cls(seconds_per_image_megapixel=BUILTIN_SECONDS_PER_IMAGE_MEGAPIXEL)
        return cls()

    def modelled_seconds(self, image_count: int, megapixels: float) -> float:
        """Expected processing time of ``image_count`` images of ``megapixels`` MP, seconds."""
        return self.seconds_per_image_megapixel * max(0, image_count) * max(0.0, megapixels)

    def deadline_seconds(
        self, image_count: int, megapixels: float, timeout_seconds: float | None = None
    ) -> float:
        """The submodel's deadline on its node, seconds.

        Args:
            image_count: images the node processes (core plus overlap).
            megapixels: their mean size, MP.
            timeout_seconds: an explicit timeout (replaces the model; at least 1 s).

        Returns:
            ``timeout_seconds`` when given, else ``slack_factor`` times the modelled time
            within ``[min_seconds, max_seconds]``.
        """
        if timeout_seconds is not None:
            return max(1.0, float(timeout_seconds))
        modelled = self.slack_factor * self.modelled_seconds(image_count, megapixels)
        return min(self.max_seconds, max(self.min_seconds, modelled))
