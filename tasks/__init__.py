"""Prefect tasks of prefect-odm (installed as ``prefect_odm.tasks``): thin wrappers over the core.

Importing this package (every flow does) sends the core loggers' lines logged inside a run to
that run's logs in the Prefect UI (:mod:`prefect_odm.tasks.run_logs`).
"""

from prefect_odm.tasks.run_logs import send_core_logs_to_runs

send_core_logs_to_runs()
