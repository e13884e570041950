"""Prefect tasks of prefect-odm (installed as ``prefect_odm.tasks``): thin wrappers over the core."""
