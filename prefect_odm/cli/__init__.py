"""The ``prefect-odm`` command line: :func:`main` (:mod:`.main`), its arguments (:mod:`.args`),
the console (:mod:`.console`) and one module per group of commands."""

from prefect_odm.cli.main import main

__all__ = ["main"]
