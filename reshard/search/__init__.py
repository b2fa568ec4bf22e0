"""Equality saturation: a Fusion encoded as an egglog program (``encode``: declarations, the
rule families of ``rules``, one fact group per op), saturated within limits (``saturate``),
in topological segments for deep programs (``segments``), and read back as a table snapshot
(``snapshot``); ``egglog_pool`` says whether egglog's thread pool survived ``fork()``.

Imports ``ir`` and ``rules`` only: search never extracts a plan (``extract``).
"""
