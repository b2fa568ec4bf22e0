"""A Hugging Face model trains through ``reshard.parallelize`` as a user writes it (issue 29):
inputs by keyword (``example_kwargs``), the ``ModelOutput``'s ``loss`` as the loss and its
``logits`` for a ``loss_fn``, the KV cache off without asking (``LlamaConfig``'s default
``use_cache=True``); ``examples/train_llama.py`` runs verbatim under torchrun (2 gloo ranks) and
its losses match eager; the README's quickstart is that example's code."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import reshard as rs
from reshard.testing.child_env import child_env

pytestmark = pytest.mark.hf

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_llama.py"
COMMAND = "torchrun --standalone --nproc-per-node 2 examples/train_llama.py"
E = runpy.run_path(str(EXAMPLE), run_name="train_llama")  # its functions, without running main()
MESH = rs.DeviceMesh([0, 1], ("tp",))


def test_keyword_inputs_and_the_model_output_loss_train_as_eager() -> None:
    """``example_kwargs={"input_ids", "labels"}``, each call ``model(**batch)``, on every rank
    simulated: the losses of 2 AdamW steps and the gradients are eager's."""
    eager = E["tiny_llama"]()
    assert eager.config.use_cache  # the default: parallelize turns it off for the export
    model = E["tiny_llama"]()
    model = rs.parallelize(model, MESH, example_kwargs=E["batch"](0), param_placements=E["megatron"](model),
                           simulate=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, model)]
    for step in range(2):
        want = eager(**E["batch"](step), use_cache=False).loss
        got = model(**E["batch"](step))
        for loss, opt in ((want, opts[0]), (got, opts[1])):
            loss.backward()
            opt.step()
            opt.zero_grad()
        torch.testing.assert_close(got, want.detach(), rtol=1e-4, atol=0)
    for n, p in eager.named_parameters():
        torch.testing.assert_close(model.module.get_parameter(n), p, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")


def shifted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, as the model computes it from ``labels=``."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


@pytest.mark.slow
def test_a_loss_fn_reads_the_model_output_logits() -> None:
    ids = E["batch"](0)["input_ids"]
    eager = E["tiny_llama"]()
    want = shifted_cross_entropy(eager(input_ids=ids).logits, ids)
    model = E["tiny_llama"]()
    model = rs.parallelize(model, MESH, example_kwargs={"input_ids": ids}, loss_fn=shifted_cross_entropy,
                           example_targets=ids, param_placements=E["megatron"](model), simulate=True)
    got = model(input_ids=ids, targets=ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=0)
    got.backward()
    want.backward()
    for n, p in eager.named_parameters():
        torch.testing.assert_close(model.module.get_parameter(n).grad, p.grad, rtol=1e-4, atol=1e-6)
    with pytest.raises(rs.ReshardError, match=r"keyword inputs \['ids'\] given, the module was planned with "
                                              r"\['input_ids'\] \(example_kwargs\)"):
        model(ids=ids, targets=ids)


def test_bad_inputs_and_a_model_output_without_loss_are_named() -> None:
    ids = E["batch"](0)["input_ids"]
    with pytest.raises(rs.ReshardError, match=r"the module returned no loss; .*called with labels="):
        rs.plan_training(E["tiny_llama"](), mesh=MESH, example_kwargs={"input_ids": ids})
    with pytest.raises(rs.ReshardError, match=r"the module returned no loss; .*the positional inputs went to the "
                                              r"forward's parameters \['input_ids', 'attention_mask'\]: pass inputs by "
                                              "keyword"):
        rs.plan_training(E["tiny_llama"](), (ids, ids), MESH)  # the labels would be the attention mask
    with pytest.raises(rs.ReshardError, match=r"example_kwargs\['return_dict'\] is a bool; only tensor inputs"):
        rs.plan_training(E["tiny_llama"](), mesh=MESH, example_kwargs={"input_ids": ids, "return_dict": True})
    with pytest.raises(rs.ReshardError, match="no example inputs: pass example_inputs"):
        rs.plan_training(E["tiny_llama"](), mesh=MESH)


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_the_example_trains_under_torchrun_as_eager() -> None:
    """The README's command, verbatim (``torchrun`` as ``python -m torch.distributed.run``); the
    script checks its losses against eager itself, and here they are checked again."""
    env = child_env(ROOT, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", RESHARD_TIMEOUT_S="60")
    cmd = [sys.executable, "-m", "torch.distributed.run", *COMMAND.split()[1:]]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = res.stdout + res.stderr[-5000:]
    assert res.returncode == 0, out
    assert "every loss matches eager PyTorch" in res.stdout, out
    losses = [float(x) for x in re.search(r"losses: (.*)", res.stdout).group(1).split()]
    assert losses[-2] < losses[0] - 0.1 and losses[-1] < losses[1] - 0.1  # trained: two batches, alternating
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(E["eager_losses"]()), rtol=0, atol=1e-4)


def _code_lines(text: str) -> list[str]:
    """Lines of code, comments and blank lines dropped, whitespace at both ends stripped."""
    return [line.split("  #")[0].strip() for line in text.splitlines() if line.strip() and
            not line.strip().startswith("#")]


def test_the_readme_quickstart_is_the_example() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", quick, re.S).group(1)
    example = set(_code_lines(EXAMPLE.read_text()))
    assert 8 <= len(_code_lines(code)) <= 14
    assert [line for line in _code_lines(code) if line not in example] == []
    assert COMMAND in quick and COMMAND in EXAMPLE.read_text()


def test_the_training_plan_explains_in_brief_and_draws(tmp_path: Path) -> None:
    """``TrainingPlan.explain()`` / ``draw()`` are the joint plan's: the example's tiny Llama (the
    program ``parallelize`` planned above: a plan-cache hit) explains in at most 120 lines of at
    most 160 characters, forward and backward apart; ``full=True`` is the step table."""
    model = E["tiny_llama"]()
    tp = rs.plan_training(model, mesh=MESH, example_kwargs=E["batch"](0), param_placements=E["megatron"](model))
    lines = tp.explain().splitlines()
    assert len(lines) <= 120 and max(map(len, lines)) <= 160, (len(lines), max(map(len, lines)))
    text = "\n".join(lines)
    assert "forward pass:" in text and "backward pass:" in text and "plan.explain(full=True)" in text
    assert len(tp.explain(full=True).splitlines()) > len(tp.plan.lowered.nodes)  # a row per step
    svg = tp.draw(tmp_path / "llama.svg").read_text()
    assert "a box per layer or module" in svg and ">lm_head<" in svg
