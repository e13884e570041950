"""The survey: listing and reading images (:mod:`.scan`, over fsspec), their headers
(:mod:`.exif` on :mod:`.jpeg_markers` and :mod:`.tiff_ifd`), the rules on positions and times
(:mod:`.flight_checks`), the GPS quality checks (:mod:`.gps_quality`), the identity cache, the
inbox of new images and camera layouts without pixels (:mod:`.layouts`).
"""
