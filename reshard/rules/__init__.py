"""The e-graph's vocabulary and rewrite rules, as data: the schema (sorts, constructors,
tables, rulesets), ``Rule`` (an egglog rule with the law it implements), one module per rule
family (IterDomain algebra, placements, propagation, resharding, alias, cross-mesh transfers,
lookups, local expansion, recompute, costs), the ops' index maps as transport facts
(``transport``), and the machine figures the cost rules read (``cost_profile``).

Imports ``ir`` only: rules never encode, saturate or extract (``search``, ``extract``).
"""
