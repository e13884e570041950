"""prefect-odm: split, process and merge city-scale drone surveys with Prefect and NodeODM.

This module stays cheap to import (Prefect imports collections at start-up): it must not import
rasterio, laspy, pycolmap, pyodm or prefect.
"""

import logging

__version__ = "0.2.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["__version__"]
