"""Differential fuzzing of autodiff: random float programs
(``reshard.testing.fuzz_programs.fusions``, on 1-D, 2-D and cross-mesh programs; a lookup's
indices and an attention's mask are not differentiated), a loss made of their outputs times
fixed random weights, ``joint`` run by the reference interpreter against torch.autograd through
the ops' torch references.  ``RESHARD_FUZZ_EXAMPLES`` overrides the example count (30 in CI: a
few seconds)."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, note, settings

from reshard.testing import fuzz_programs as FP
from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss

EXAMPLES = int(os.environ.get("RESHARD_FUZZ_EXAMPLES", "30"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(FP.fusions(max_ops=20))
def test_joint_matches_torch_autograd(f):
    note(FP.fusion_source(f))
    wrt = FP.trained_inputs(f)  # (a lookup's indices and an attention mask have no gradient)
    loss = weighted_loss(f, [f.tensors[t] for t, _ in f.outputs])
    gen = torch.Generator().manual_seed(0)
    values = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=gen, dtype=torch.float64)
              for i in f.inputs if f.tensors[i].name in wrt}
    indices = {k: v for k, v in FP.random_inputs(f, 1).items() if k not in values}  # (drawn in range)
    check_joint(f, loss, {**values, **indices, **loss_weights(f, 1)}, wrt, rtol=1e-7, atol=1e-7)
