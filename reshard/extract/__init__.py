"""Extraction: the cheapest plan out of a saturated e-graph's snapshot, decoded into
``PlanNode``s.  ``dag``: the e-nodes, the class graph (``parents_of``), the greedy DAG extractor
and the sharing search; ``extract_ilp``: the exact extractor; ``windows``: the ILP on windows
of the greedy plan; ``pricing``: a plan with one class implemented otherwise, priced;
``budget``: byte budgets met by a searched multiplier, on kept bytes (``memory``) or received
bytes (``received``); ``extract``: selection, canonical order and decoding; ``plan_node``: the
decoded plan; ``layer_reuse``: a stack's plan from the plan of a few of its layers.

Imports ``ir``, ``passes`` (the buckets' values), ``rules`` and ``search`` only: lowering,
explanations and ``plan`` read what it returns.
"""
