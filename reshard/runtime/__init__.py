"""Runtime: a ``Program`` executed.  ``simulator`` (every rank in one process, with
``collectives``' reference implementations), ``local_ops`` (local steps with torch; each op
kind's ``apply`` step there, ``cpu_steps``, registered by kind),
``remap_fast`` (remap steps as views or strided copies), ``gpu_local`` (local steps as NVRTC
kernels: fused chains, and each op kind's GPU step, ``gpu_steps``, registered by kind and run
through ``kernel_kit.KernelKit``), ``cuda_graph`` (a simulated step captured once as a CUDA graph and replayed),
``distributed`` (one process per device over ``torch.distributed``: ``DistRuntime``,
``launch``, the torch call of each collective kind), ``staging`` (buffer layouts handed to NCCL / gloo).

Imports ``ir`` and ``codegen`` only: the runtime never builds or reads an e-graph.
"""
