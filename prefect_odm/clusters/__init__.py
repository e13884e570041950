"""Several processing clusters: the cluster directory, the router and the capacity figures.

``directory`` (pydantic records of the clusters), ``router`` (pure: which cluster or queue a
submodel goes to, and why), ``capacity`` (each cluster's figures from Prefect's public API and its
nodes' ``/info``), ``service`` (the FastAPI app of ``prefect-odm capacity serve``).
"""
