"""``reshard.from_torch``: a PyTorch module or function -> a reshard ``Fusion``.

The module is traced with ``torch.export.export`` (ATen graph with static shapes).  Nodes
that read no user input and no parameter are evaluated at conversion (``folding``: causal
masks, rotary cos/sin, position ids; ``full_like``/``new_ones``/... of any value); each other
ATen node is decomposed into Fusion ops by its handler (``aten_*`` modules, one per family;
``converter.OPS``):

=====================================  ==================================================
ATen ops                               Fusion ops
=====================================  ==================================================
linear, matmul, mm, bmm, addmm         permute (weight) + matmul (+ broadcast bias, add);
                                       batch dims broadcast like ``torch.matmul``
add, sub, mul, div, maximum, minimum,  binary, operands broadcast (``Fusion.broadcast_to``)
rsub, atan2, remainder
                                       and cast to the result dtype; ``* c``, ``/ c`` by a
                                       Python scalar: ``scale``; ``+ c``: a constant input
neg exp expm1 log log1p log2 erf tanh  unary; gelu(approximate="tanh"): ``gelu_tanh``;
relu silu sigmoid sqrt rsqrt abs gelu  frac (torch's decomposition): ``x - trunc(x)``
sin cos sign floor ceil trunc,
pow by 1/2/3/±0.5/-1/-2, reciprocal
clamp clamp_min clamp_max hardtanh,    where of comparisons with the bounds / with 0;
leaky_relu, elu (celu, selu); isnan    elu's negative side: expm1 (``aten_elementwise``);
                                       isnan: ``x != x``
eq ne lt le gt ge, logical_and/or/not  comparisons / logical ops (bool); ``&`` ``|`` ``~``
(and ``&``/``|``/``~`` on bool),       on bool; where (masked_fill: where)
where, masked_fill
view reshape (un)squeeze flatten       reshape (identity when the shape is unchanged)
ravel atleast_1d/2d/3d, expand         broadcast
broadcast_tensors
permute transpose t movedim            permute / movedim
slice narrow select split chunk        slice (+ reshape); split/chunk/unbind: tuples
unbind, cat stack, repeat tile, roll   cat; repeat/tile: reshape, broadcast, reshape; roll:
                                       cat of two slices
pad / constant_pad_nd (constant)       pad (value 0), cat with a constant block, slice
index by constant runs of indices      slice, reshape, broadcast (``x[batch_idx, kv_idx]``)
sum mean amax max (keepdim, all dims)  reduce (+ reshape for keepdim); any/all: max of
any all, cumsum                        bools; cumsum
min (as max of -x)
softmax, log_softmax, _safe_softmax,   max, sub, exp, sum (, log), div / sub (safe: where)
logsumexp
var std var_mean std_mean              mean, sub, mul, sum, scale (, sqrt)
linalg_vector_norm (ord 0, 1, 2, inf)  reductions of x*x / abs / x != 0 (, sqrt)
layer_norm, rms_norm, group_norm       mean, sub, mul, mean, add eps, rsqrt, mul (w, b)
scaled_dot_product_attention           attention (fused; its decomposed form an e-graph
                                       alternative); GQA by broadcast + reshape; bool masks
                                       additive (``aten_attention``)
flip cumprod sort topk argmax argmin   along (the dim gathered, the others may stay sharded);
(max.dim / min.dim's indices: argmax)  sort / topk: values and indices where read
embedding, gather (one index per row)  embedding, pick
one_hot                                eq of the broadcast ids and a constant arange
cross_entropy_loss, nll_loss           logsumexp - pick, ignore_index by ne/where, mean /
                                       sum / none; class weights (embedding of w [C, 1])
                                       and label_smoothing (C * lse - sum x) (``aten_lookup``)
_to_copy to type_as                    cast (identity when the dtype is unchanged)
clone contiguous alias detach dropout  identity (dropout only in eval or with p = 0)
(eval)
view_as_complex view_as_real,         complex values as pairs of reals (``aten_complex``):
complex mul add sub div neg conj real  the views identities; mul: ``complex_mul`` (by a real:
imag abs angle polar complex, views    mul / scale); conj: mul by (1, -1); real / imag: slice
of complex values                      of the pair dim; the others act on the pairs
wrap_with_autocast,                    the body's ops, inlined (``higher_order``); a no-grad
wrap_with_set_grad_enabled             region's results detached when training
index / index_select / gather by        embedding / pick at linear indices; scatters,
tensors, scatter(_add, _reduce),       index_put: unpick / embedding_grad summed, where of
index_put, embedding_dense_backward    the hits; a place named twice: the last write, as
                                       torch's CPU kernels (``aten_indexing``); x[mask] = v:
                                       where (one value)
copy_ fill_ add_ ... on values the     the program functionalized first (``state_writes``):
module makes, x[a:b] = y               slice_scatter / select_scatter as cat of slices
convolution, avg / adaptive avg pools,  strided slices of the padded input (windows): a
slice with a step, diagonal            batched matmul (conv), sums (pools) (``aten_windows``)
any other ATen op                      torch's decomposition of it (a core ATen op: torch's
                                       own table), converted in its place (``decomposed``:
                                       mse_loss, softplus, einsum, max_pool2d, upsample, ...)
                                       coverage of the core ATen set: docs/ops.md
=====================================  ==================================================

Complex values (inputs, parameters, buffers, constants, results) are pairs of reals, shape
``S + (2,)`` (``pairs``; their ops: ``aten_complex``): ``view_as_complex`` and ``view_as_real``
are identities, a complex product is ``complex_mul``; placements name a complex value's own
dims, and a complex output is returned as its pairs (``torch.view_as_real``).

Module parameters and persistent buffers become Fusion inputs named by their FQN
(``"fc1.weight"``); lifted tensor constants, folded values that the program reads and
scalar constants that the IR cannot hold as attributes (the ``eps`` of a norm, ``x + 1``)
become replicated inputs (a lifted constant named by its FQN, the others ``_c0``, ``_c1``,
...) whose values ``TorchProgram.inputs`` supplies.  Only nodes the outputs depend on are
converted.  A 0-dim value (a loss, a 0-dim input: a one-sample target, a scalar scale) is
a 0-dim Fusion value (shape ``()``); a 0-dim input takes Replicate or Partial placements only.  An ATen op with
neither a handler nor a decomposition that converts raises ``ReshardError`` ("unsupported
op") naming the op, the graph node and the user's source line; so does an
in-place update of a parameter, buffer or input (``state_writes``).  ``train=True`` returns
the training program (``training``): the loss and the gradients of the parameters.

The meta device: a module whose parameters are on the meta device, or example inputs that
are meta or fake tensors, is traced on the meta device (inputs are made meta tensors of the
same shape and dtype); the program plans (``reshard.optimize``) without any values, and
``TorchProgram.inputs`` raises.

Placements (``in_placements``, ``out_placements``, ``param_placements``) take reshard
placements, ``torch.distributed.tensor`` placements (``Shard``, ``Replicate``,
``Partial("sum" | "max")``), a ``TensorSharding``, or None (inputs only: the optimizer
chooses how that input is fed).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ..ir.errors import ReshardError
from ..ir.fusion import Tensor
from ..ir.mesh import DeviceMesh
from ..ir.sharding import Replicate
from . import aten_along, aten_attention, aten_complex, aten_copies, aten_elementwise, aten_linear  # noqa: F401
from . import aten_lookup, aten_reductions, aten_views, decomposed, higher_order  # noqa: F401  (registers)
from . import aten_indexing, aten_windows  # noqa: F401  (registers)
from .converter import Converter, live_nodes, module_paths
from .export_hints import data_dependent
from .moe import dense_experts
from .pairs import as_pairs, is_complex, pair_sharding
from .program import TorchProgram, per_item, to_reshard_placements
from .state_writes import DATA_WRITE, check_state_writes, data_write, functional
from .training import gradient_program, trainable_names, training_mode

__all__ = ["TorchProgram", "from_torch", "to_reshard_placements"]


def named_forward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its code object named ``forward`` (same file, lines, globals, closure and
    defaults; a ``functools.partial`` or bound method: its function so renamed): torch.export
    keeps only the frames named ``forward`` in a node's ``stack_trace`` (torch 2.11 has no
    other way to keep a frame), so errors cite the user's line, not ``_FnModule``'s call of
    it.  A callable of another kind is returned as it is."""
    if isinstance(fn, functools.partial):
        return functools.partial(named_forward(fn.func), *fn.args, **fn.keywords)
    if isinstance(fn, types.MethodType):
        return types.MethodType(named_forward(fn.__func__), fn.__self__)
    if not isinstance(fn, types.FunctionType):
        return fn
    code = fn.__code__.replace(co_name="forward", co_qualname="forward")
    g = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    g.__kwdefaults__ = fn.__kwdefaults__
    return g


class _FnModule(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = named_forward(fn)

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def mesh_of(mesh: Any) -> DeviceMesh:
    if isinstance(mesh, DeviceMesh):
        return mesh
    if hasattr(mesh, "mesh") and hasattr(mesh, "mesh_dim_names"):  # torch.distributed DeviceMesh
        names = mesh.mesh_dim_names
        ranks = mesh.mesh.tolist()
        return DeviceMesh(ranks, tuple(names) if names else None)
    if isinstance(mesh, (list, tuple)):
        return DeviceMesh(list(mesh))
    raise ReshardError(f"from_torch: mesh must be a reshard.DeviceMesh (or a torch DeviceMesh), got {mesh!r}")


def state_aliases(module: torch.nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter and buffer of ``module``, by the tensor's ``id`` (a tied
    parameter has several: GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``)."""
    groups: dict[int, list[str]] = {}
    for n, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(t), []).append(n)
    return groups


def _tied_names(module: torch.nn.Module, ep: Any, param_placements: Mapping[str, Any]) -> dict[str, Any]:
    """``param_placements`` with each spec given to every name of its tensor: a tied parameter
    may be named by any of its names (``state_aliases``), whichever the exported program reads;
    two different specs for one tensor are an error."""
    groups = state_aliases(module)
    exported = set(ep.graph_signature.parameters) | set(ep.graph_signature.buffers)
    aliases = {n: [m for m in group if m in exported] for group in groups.values() for n in group}
    out: dict[str, Any] = dict(param_placements)
    for n, spec in param_placements.items():
        for m in aliases.get(n, [n]):
            if m in param_placements and param_placements[m] != spec:
                raise ReshardError(f"from_torch: param_placements give {n!r} and its tied alias {m!r} different "
                                   f"placements ({spec} vs {param_placements[m]})")
            out[m] = spec
    return out


def _on_meta(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor]) -> bool:
    """Is the program traced on the meta device: a parameter or buffer is a meta tensor, or an
    example input is a meta or fake tensor?"""
    from torch._subclasses.fake_tensor import FakeTensor

    return any(t.is_meta for t in (*module.parameters(), *module.buffers())) or \
        any(x.is_meta or isinstance(x, FakeTensor) for x in example_inputs)


def from_torch(module_or_fn: torch.nn.Module | Callable[..., Any], example_inputs: Sequence[torch.Tensor],
               in_placements: Any = None, out_placements: Any = None, mesh: Any = None, *,
               param_placements: Mapping[str, Any] | None = None, decompose: bool = False,
               train: bool = False) -> TorchProgram:
    """Trace ``module_or_fn(*example_inputs)`` with ``torch.export`` and decompose it into a
    reshard ``Fusion`` on ``mesh``.

    Args:
        in_placements: per user input (call order) a placement spec, or a mapping name ->
            spec that may also name parameters/buffers (by FQN); None = all Replicate.  A
            spec of None leaves that input's sharding to the optimizer.
        out_placements: per output (flattened, in order) a placement spec; None = Replicate.
        mesh: a ``reshard.DeviceMesh``.
        param_placements: mapping FQN -> spec for parameters and buffers (default Replicate).
        decompose: convert ``ep.run_decompositions()`` (core ATen) instead of the exported
            graph (longer; the default already converts an op it has no handler for through
            torch's decomposition of that op, ``decomposed``).
        train: export in training mode (``module.train()``, restored afterwards) and return
            the training program (``frontend.training``): the module's first output is the
            loss (a float scalar: Hugging Face models called with ``labels=``), the Fusion's
            outputs are the loss, then the gradient of every parameter that requires grad,
            ``"grad.<FQN>"`` at that parameter's placements (``TorchProgram.grads``).

    A module on the meta device (or meta / fake example inputs) is traced on the meta
    device: the program plans, without values (module docstring).

    Returns a ``TorchProgram``: ``.fusion``, ``.input_names``, ``.inputs(*args)``.
    Raises ``ReshardError`` for an unsupported op (naming it, the graph node and the source
    line), an in-place update of a parameter, buffer or input (``state_writes``), a bad
    placement, or inputs of a dtype the IR does not hold; with ``train``, also for dropout
    with p > 0 and an op without a backward (naming it and its source line).
    """
    if mesh is None:
        raise ReshardError("from_torch: a mesh is required (reshard.DeviceMesh([0, 1]), ...)")
    mesh = mesh_of(mesh)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise ReshardError(f"from_torch: example_inputs[{i}] is a {type(x).__name__}; only tensor arguments "
                               "are supported (bind other arguments with functools.partial)")
    if isinstance(module_or_fn, torch.nn.Module):
        module, arg_names = module_or_fn, None
    elif callable(module_or_fn):
        module = _FnModule(module_or_fn)
        try:
            ps = [p.name for p in inspect.signature(module_or_fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            arg_names = ps[:len(example_inputs)] if len(ps) >= len(example_inputs) else None
        except (TypeError, ValueError):
            arg_names = None
    else:
        raise ReshardError(f"from_torch: expected an nn.Module or a callable, got {type(module_or_fn).__name__}")
    # torch.export fakes a view input through its base, and cannot remake a complex view of a
    # real base (``view_as_complex(x)``: "Tensor must have a last dimension of size 2"): a copy
    example_inputs = tuple(x.clone() if x.is_complex() and x._is_view() else x for x in example_inputs)
    on_meta = _on_meta(module, example_inputs)
    if on_meta:  # shapes only: every input a meta tensor
        example_inputs = tuple(torch.empty(x.shape, dtype=x.dtype, device="meta") for x in example_inputs)
    try:
        with training_mode(module, train), dense_experts(module):
            ep = torch.export.export(module, example_inputs)
    except Exception as e:  # torch.export's own errors are many types
        hint = data_dependent(e) or (data_write(module, example_inputs) if DATA_WRITE in str(e) else None)
        if hint is not None:
            raise hint from None  # (torch's own text is advice for torch developers)
        raise ReshardError(f"from_torch: torch.export.export failed: {type(e).__name__}: {e}") from e
    check_state_writes(ep)  # before decomposing: the graph still has the in-place ops and their lines
    if not decompose:  # (decomposing functionalizes too)
        ep = functional(ep)
    else:
        try:
            ep = ep.run_decompositions()
        except Exception as e:
            raise ReshardError(f"from_torch: torch.export's run_decompositions failed: {type(e).__name__}: {e}") from e
    params = _tied_names(module, ep, param_placements or {})
    trained = trainable_names(module) if train else None
    return _convert(ep, mesh, arg_names, in_placements, out_placements, params, on_meta, trained)


def _convert(ep: Any, mesh: DeviceMesh, arg_names: list[str] | None, in_placements: Any, out_placements: Any,
             param_placements: Mapping[str, Any], on_meta: bool, trained: set[str] | None) -> TorchProgram:
    """``trained``: None, or the training program (``from_torch(train=True)``) for these parameters."""
    from torch.export.graph_signature import InputKind, OutputKind

    cv = Converter(mesh, on_meta, train=trained is not None)
    sig = ep.graph_signature
    graph = ep.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(sig.input_specs):
        raise ReshardError("from_torch: internal: placeholders and input specs differ")
    user, state, consts = [], [], []
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            nm = arg_names[len(user)] if arg_names else node.name
            user.append((node, nm))
        elif spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            state.append((node, spec.target))
        elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.BUFFER):  # non-persistent buffers: constants
            consts.append((node, spec.target))
        else:
            raise ReshardError(f"from_torch: unsupported graph input {node.name!r} of kind {spec.kind.name}")
    user_names = [nm for _, nm in user]
    cv.taken |= set(user_names) | {t for _, t in state + consts}
    specs = per_item(in_placements, user_names, "in_placements", "input")
    known = set(user_names) | {t for _, t in state} | {s.target for s in sig.input_specs
                                                       if s.kind == InputKind.BUFFER}
    for k in list(specs) + list(param_placements):
        if k not in known:
            raise ReshardError(f"from_torch: placements given for {k!r}, which is not an input, parameter or "
                               f"buffer of the program; known: {sorted(known)}")
    specs = {**{t: param_placements[t] for _, t in state if t in param_placements}, **specs}

    for spec in sig.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise ReshardError(f"from_torch: the program has a {spec.kind.name} output ({spec.target}), "
                               "which is not supported")
    out_node = next(n for n in graph.nodes if n.op == "output")
    outputs = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    if trained is not None:
        outputs = outputs[:1]  # the loss
    live = live_nodes(outputs)
    for node, nm in consts:  # folded where read (``folding``), named by their FQN
        value = ep.constants[nm].detach()
        cv.env[node.name] = value
        cv.constant_names[id(value)] = nm
    state_used: list[str] = []
    for node, nm in user + state:
        cv.node = node
        val = node.meta.get("val")
        is_user = any(node is u for u, _ in user)
        if not is_user and node not in live:
            continue
        if not isinstance(val, torch.Tensor):
            raise cv.fail(f"input {nm!r} is not a tensor")
        dt = cv.dtype(as_pairs(val).dtype)
        shape = tuple(int(s) for s in val.shape)
        default = [Replicate()] * mesh.ndim
        ts = to_reshard_placements(specs.get(nm, default), shape, mesh, f"from_torch: placements of {nm!r}")
        if val.is_complex():  # its pairs (``pairs``)
            shape, ts = shape + (2,), pair_sharding(ts)
        if not is_user:
            cv.values[nm] = as_pairs(ep.state_dict[nm].detach())
            state_used.append(nm)
        cv.env[node.name] = cv.f.input(nm, shape, dt, mesh, ts)

    for node in graph.nodes:
        if node.op == "call_function" and node in live:
            for path in module_paths(node):
                cv.last_in[path] = node
    cv.run_graph(ep.graph_module, live)
    outs = []
    for o in outputs:
        v = cv.value(o)
        if isinstance(v, torch.Tensor) and v.numel() == 0:
            raise ReshardError(f"from_torch: output {o} has no elements (shape {tuple(v.shape)}); the Fusion IR "
                               "holds no empty values")
        if isinstance(v, torch.Tensor):  # a constant output
            v = cv.tensor(v, "output")
        if not isinstance(v, Tensor):
            raise ReshardError(f"from_torch: output {o} is not a tensor the Fusion computes ({v!r})")
        outs.append(v)
    ospecs = per_item(out_placements, [f"output {i}" for i in range(len(outs))], "out_placements", "output")
    for i, (o, t) in enumerate(zip(outputs, outs)):
        where = f"from_torch: placements of output {i}"
        pairs = isinstance(o, torch.fx.Node) and is_complex(o.meta.get("val"))  # placed by its complex dims
        spec = ospecs.get(f"output {i}", [Replicate()] * mesh.ndim)
        ts = to_reshard_placements(spec, t.shape[:-1] if pairs else t.shape, mesh, where)
        if ts is None:
            raise ReshardError(f"{where}: outputs need a placement (None is only for inputs)")
        ts = pair_sharding(ts) if pairs else ts
        cv.f.output(t, ts)
    fusion, grads = cv.f, {}
    if trained is not None:
        fusion, grads = gradient_program(cv.f, [n for n in state_used if n in trained], cv.origin)
    return TorchProgram(fusion, tuple(user_names), tuple(state_used), tuple(cv.const_names), cv.values, ep, grads)

