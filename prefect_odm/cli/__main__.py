"""``python -m prefect_odm.cli``: the ``prefect-odm`` command."""

from prefect_odm.cli.main import main

raise SystemExit(main())
