"""Fusion -> Fusion passes: each returns a Fusion computing the same outputs, and none decides a
sharding (the e-graph does).  ``prepare`` (``PASSES``) runs, in order, those ``optimize()``
runs before encoding: ``padding`` (uneven dims padded inside the plan), ``recompute`` (saved
twins for a memory budget), ``layers`` (the stack of repeated layers), ``buckets`` (gradient
buckets); ``autodiff`` (the joint forward and backward program) and ``pins`` (values pinned at
given shardings) run where a caller asks for them; ``phases`` says which values a training
Fusion computes in its backward pass.

Imports ``ir`` only; ``rules`` and everything after it may import this package."""
