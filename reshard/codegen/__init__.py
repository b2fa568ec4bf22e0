"""Codegen: an extracted plan lowered to the SPMD host program and its CUDA kernels.
``lower`` (PlanNodes -> ``Program``, dispatching on each node's tag; ``transposes``,
``scatter_add``, ``unpick_chains``, ``fuse`` and ``alloc`` are its passes; ``step_attrs``: each op kind's ``apply``
step attributes, registered by kind), ``program`` (``Program``, ``Step``,
the digest), ``remap_index`` / ``remap_form`` / ``remap_analytic`` (where a remap step's
elements come from, and its view or strided form), ``kernels``, ``elementwise_cuda`` (the
elementwise functions' expressions, by name) and ``fast_math`` (CUDA C++ source), ``nvrtc`` (compilation and launches).

Imports ``ir``, ``passes`` (phases) and ``extract`` (the decoded plan) only: lowering knows no
e-graph constructor; ``runtime`` and the explanations import it.
"""
