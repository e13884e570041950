"""Prefect flows of prefect-odm (installed as ``prefect_odm.flows``)."""

from prefect_odm.flows.process_inbox import process_inbox
from prefect_odm.flows.process_submodel import process_submodel
from prefect_odm.flows.reconstruct import reconstruct

__all__ = ["process_inbox", "process_submodel", "reconstruct"]
