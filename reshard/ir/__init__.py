"""Fusion IR: what a program and its values mean.  Meshes, IterDomains, shardings and
``shard`` / ``unshard`` (the oracle), dtypes, the ``Fusion`` container, the op registry
(``ops``: each op's meaning, declared once), the reference interpreter, the table of collective
kinds, the one check of a plan's inputs, a program's stack of repeated layers, and small shared
helpers (row-major strides, bounded caches).

Imports no other part of reshard: every other room may import it."""

from .errors import ReshardError
from .fused_shard import FusedShard
from .ids import ID, Inner, Merge, Outer, Root
from .mesh import DeviceMesh
from .sharding import Partial, Placement, Replicate, Shard, TensorSharding, shard, unshard

__all__ = ["ReshardError", "ID", "Root", "Outer", "Inner", "Merge", "DeviceMesh", "Placement", "Replicate",
           "Shard", "FusedShard", "Partial", "TensorSharding", "shard", "unshard"]
