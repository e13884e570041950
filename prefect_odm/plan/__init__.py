"""Split planning (pure core): target sizes and bisection (:mod:`.partition`), core areas
(:mod:`.core_areas`), the planner (:mod:`.planning`), the checks run on every plan
(:mod:`.checks`), coverage gaps, the memory model (:mod:`.memory`, with ODM's depth-map size rule
in :mod:`.depthmaps`), the stored plan (:mod:`.cache`) and the plan picture (:mod:`.picture`).
"""
