"""Processing nodes: the node protocol (:mod:`.backend`), the NodeODM client over pyodm
(:mod:`.client`, :mod:`.uploads`), node health, capacity and messages, the placement pool
(:mod:`.pool`), the nodes of one run (:mod:`.cluster`) and the submodel runner (:mod:`.runner`).

Adapters over the core: nothing here imports Prefect.
"""
