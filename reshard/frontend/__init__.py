"""Frontends: build reshard Fusions from other program representations.

``torch_export`` (``from_torch``: the entry point) -> ``converter`` (graph -> Fusion, node by
node) with ``folding`` (constant folding) and the ATen handlers, one module per family
(``aten_linear``, ``aten_elementwise``, ``aten_views``, ``aten_reductions``,
``aten_attention``, ``aten_lookup``, ``aten_copies``); ``program`` (``TorchProgram``, placements);
``state_writes`` (in-place updates of parameters, buffers and inputs: an error); ``training``
(``from_torch(..., train=True)``: the loss and the parameters' gradients); ``loss`` (a module
and a ``loss_fn`` as one module that returns the loss, to export for training).

Imports ``ir`` and ``passes`` (``autodiff``) only: a frontend builds a Fusion and never plans it.
"""

from .program import TorchProgram, to_reshard_placements
from .torch_export import from_torch

__all__ = ["TorchProgram", "from_torch", "to_reshard_placements"]
