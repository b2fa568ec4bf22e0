"""CUDA C++ source generation for reshard's local kernels.

Every function here is pure: it takes a specification (dtypes, shapes, permutation, ...)
and returns a :class:`KernelSource` holding the CUDA C++ text of one ``extern "C"
__global__`` kernel plus the launch geometry to use with it.  Nothing here touches a GPU
or NVRTC; :mod:`reshard.codegen.nvrtc` compiles and launches.

Conventions shared by all kernels
---------------------------------
* Kernel names are ``rs_<kind>_<hash>`` where ``<hash>`` is a short sha256 of the full
  specification, so two different specializations never share a name.
* The first parameter is always the output pointer, followed by the input pointer(s);
  pointwise kernels end with a runtime element count ``long long n``.  ``KernelSource.params``
  spells the parameter list out.
* Floating dtypes are ``float32`` (``float``), ``bfloat16`` (``__nv_bfloat16``, from
  ``cuda_bf16.h``) and ``float16`` (``__half``, from ``cuda_fp16.h``).  Arithmetic is done in
  float32.  Pointwise kernels also load and store ``bool`` (one byte, ``unsigned char``),
  held in registers as the float 0 or 1 (stored as ``value != 0``, torch's conversion), and
  ``int64`` / ``int32``, held in 64-bit signed registers (``long long``; integer arithmetic
  wraps like torch's two's complement, an ``int32`` value wraps to 32 bits where it is stored
  or cast).
  Pure data-movement kernels (permute, strided copy, pad, cat, unpick) move raw bits, so
  they accept any dtype of known item size (see :data:`ITEMSIZE`).
* Shapes are baked in as compile-time constants (fast index arithmetic by constant
  divisors); indices are 64-bit unless every index and offset fits in 31 bits.
* No headers besides ``cuda_bf16.h`` / ``cuda_fp16.h`` are included (NVRTC has no C++
  standard library), and those only when a 16-bit float dtype takes part in arithmetic.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Callable, Sequence

from reshard.ir.errors import ReshardError
from reshard.ir.ops.elementwise import BINARY_FNS, UNARY_FNS
from reshard.ir.strides import row_major_strides
from reshard.ir.tensor_cache import BoundedCache

from .elementwise_cuda import BINARY_CUDA, MASKED_CUDA, UNARY_CUDA
from .fast_math import ROUNDS_TO_16BIT, gelu16_source

__all__ = [
    "memoized",
    "ITEMSIZE",
    "FLOAT_DTYPES",
    "POINTWISE_DTYPES",
    "WRAPS_IN_REGISTERS",
    "KernelSource",
    "Instr",
    "normalize_dtype",
    "pointwise_vector_width",
    "pointwise_vector_ok",
    "broadcast_strides",
    "pointwise_kernel",
    "cast_kernel",
    "permute_kernel",
    "strided_copy_kernel",
    "pad_kernel",
    "cat_kernel",
    "unpick_kernel",
    "unpick_add_kernel",
    "fill_kernel",
    "lookup_kernel",
    "embedding_grad_kernel",
    "reduce_kernel",
]

#: Threads per block of 1-D kernels.
BLOCK = 256
#: Upper bound on the grid of grid-stride kernels (more blocks just loop).
MAX_GRID = 1 << 16

#: Bytes per element of the dtypes the data-movement kernels accept.
ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

# dtype -> (C type, to-float expression, from-float expression, header or None)
_FLOAT_INFO: dict[str, tuple[str, str, str, str | None]] = {
    "float32": ("float", "({x})", "({x})", None),
    "bfloat16": ("__nv_bfloat16", "__bfloat162float({x})", "__float2bfloat16({x})", "cuda_bf16.h"),
    "float16": ("__half", "__half2float({x})", "__float2half({x})", "cuda_fp16.h"),
}
#: Dtypes the arithmetic kernels (pointwise, reduce) accept.
FLOAT_DTYPES: tuple[str, ...] = tuple(_FLOAT_INFO)
# the ints pointwise kernels load and store: (C type, to its 64-bit register, from it (wraps), header)
_INT_INFO: dict[str, tuple[str, str, str, str | None]] = {
    "int64": ("long long", "({x})", "({x})", None),
    "int32": ("int", "((long long){x})", "((int){x})", None),
}
# the same for the values pointwise kernels load and store: the floats, bool as 0 / 1, the ints
_POINTWISE_INFO: dict[str, tuple[str, str, str, str | None]] = {
    **_FLOAT_INFO, "bool": ("unsigned char", "({x} ? 1.0f : 0.0f)", "({x} != 0.0f)", None), **_INT_INFO,
}
#: Dtypes pointwise kernels load and store (computing in float32, a bool as 0 or 1, the ints
#: in 64-bit signed integers).
POINTWISE_DTYPES: tuple[str, ...] = tuple(_POINTWISE_INFO)
#: Dtypes a pointwise kernel's registers hold wider than the dtype and a fused chain brings back
#: to it after each member of one (``codegen.fuse``): int32, held in 64 bits, wraps as the unfused
#: steps' results do.  (The 16-bit floats are held in float32 too, but a fused chain of them is
#: computed in float32 and rounded once, where a value is stored, as Inductor computes it.)
WRAPS_IN_REGISTERS = frozenset({"int32"})

_ALIASES = {
    "fp32": "float32", "float": "float32", "f32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16", "half": "float16", "f16": "float16",
    "fp64": "float64", "double": "float64", "f64": "float64",
    "long": "int64", "int": "int32", "short": "int16",
}

# raw (bit-moving) unsigned C type per item size
_RAW_TYPE = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long", 16: "uint4"}


@dataclass(frozen=True)
class KernelSource:
    """One generated kernel: its source and how to launch it.

    Attributes:
        name: the ``extern "C"`` symbol, unique per specialization.
        source: complete CUDA C++ translation unit.
        kind: "pointwise", "permute_tiled", "gather", "pad", "cat", "reduce_rows", ...
        params: the parameter list, e.g. ``("out:ptr", "in0:ptr", "n:i64")``.
        block: threads per block (x, y, z).
        grid: blocks (x, y, z) for kernels whose size is baked in; ``None`` when the grid
            depends on a runtime element count (pointwise; see :meth:`grid_for`).
        shared_mem: dynamic shared memory bytes (static shared memory is in the source).
        elems_per_thread: elements one thread handles per loop iteration (vector width).
    """

    name: str
    source: str
    kind: str
    params: tuple[str, ...]
    block: tuple[int, int, int] = (BLOCK, 1, 1)
    grid: tuple[int, int, int] | None = None
    shared_mem: int = 0
    elems_per_thread: int = 1

    def grid_for(self, n: int | None = None) -> tuple[int, int, int]:
        """The grid to launch with: the baked-in one, or one sized for ``n`` elements."""
        if self.grid is not None:
            return self.grid
        if n is None:
            raise ReshardError(f"kernel {self.name} needs the element count n to size its grid")
        return (_grid1d(_ceil_div(max(n, 1), self.elems_per_thread), self.block[0]), 1, 1)


# --------------------------------------------------------------------------------------
# helpers

_MEMO: BoundedCache[tuple, KernelSource] = BoundedCache(4096)


def memoized(build: Callable[..., KernelSource], *args: object, **kwargs: object) -> KernelSource:
    """``build(*args, **kwargs)`` for one of this module's generators, remembered by the
    ``repr`` of its arguments (so that scale factors 0.0 and -0.0 stay apart): repeated
    launches skip regenerating and hashing the source (about 20 us each)."""
    key = (build.__name__, repr(args), repr(sorted(kwargs.items())))
    ks = _MEMO.get(key)
    if ks is None:
        ks = _MEMO[key] = build(*args, **kwargs)
    return ks


def normalize_dtype(dtype: object) -> str:
    """Canonical dtype name ("float32", "bfloat16", ...) from a string or torch dtype."""
    s = str(dtype)
    if s.startswith("torch."):
        s = s[len("torch."):]
    s = _ALIASES.get(s, s)
    if s not in ITEMSIZE:
        raise ReshardError(f"unsupported dtype {dtype!r}; known: {sorted(ITEMSIZE)}")
    return s


def _float_dtype(dtype: object) -> str:
    d = normalize_dtype(dtype)
    if d not in _FLOAT_INFO:
        raise ReshardError(f"dtype {d} not supported by arithmetic kernels; use one of {FLOAT_DTYPES}")
    return d


def _pointwise_dtype(dtype: object) -> str:
    d = normalize_dtype(dtype)
    if d not in _POINTWISE_INFO:
        raise ReshardError(f"dtype {d} not supported by pointwise kernels; use one of {POINTWISE_DTYPES}")
    return d


def _spec_hash(kind: str, spec: object) -> str:
    blob = json.dumps([kind, spec], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _grid1d(work_items: int, block: int) -> int:
    return max(1, min(_ceil_div(work_items, block), MAX_GRID))


def _prod(xs: Sequence[int]) -> int:
    return math.prod(xs)


def _check_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    out = tuple(int(s) for s in shape)
    if any(s < 0 for s in out):
        raise ReshardError(f"{what}: negative size in shape {out}")
    return out


def _headers(dtypes: Sequence[str]) -> str:
    hs = sorted({_FLOAT_INFO[d][3] for d in dtypes if d in _FLOAT_INFO and _FLOAT_INFO[d][3]})
    return "".join(f"#include <{h}>\n" for h in hs)


def _float_literal(v: float) -> str:
    """An exact float32 C expression for ``v`` (rounded to float32 like torch does)."""
    bits = struct.unpack("<I", struct.pack("<f", float(v)))[0]
    f = struct.unpack("<f", struct.pack("<I", bits))[0]
    if math.isfinite(f):
        return f"{f!r}f" if "e" in repr(f) or "." in repr(f) else f"{f!r}.0f"
    return f"__int_as_float(0x{bits:08x})"


def _idx_type(*extents: int) -> str:
    """32-bit unsigned indices when every extent fits in 31 bits, else 64-bit."""
    return "unsigned int" if max(extents, default=0) < 2**31 else "unsigned long long"


def _tile_loop(it: str, total: int, tiles_a: int, tiles_b: int, bvar: str, batch: list[int],
               bshape: list[int], ist: list[int], ost: list[int], group: int = 0) -> list[str]:
    """CUDA lines opening a transpose kernel's grid-stride loop over (batch, tile_a, tile_b):
    tile indices ``ta``/``tb``, batch index ``bvar`` and the batch offsets ``in_base``/``out_base``.

    Tiles run with ``tb`` fastest, or, with ``group`` > 0 (and more tile rows than that), in
    bands of ``group`` tile rows, ``ta`` fastest inside a band: the blocks resident at once
    then cover a near-square patch, so both the rows they read and the rows they write are
    a few long runs instead of one short piece of every output row."""
    lines = [f"  for ({it} t = blockIdx.x; t < {total}u; t += gridDim.x) {{"]
    if 0 < group < tiles_a:
        band = group * tiles_b
        lines += [
            f"    const {it} {bvar} = t / {tiles_a * tiles_b}u;",
            f"    const {it} tt = t % {tiles_a * tiles_b}u;",
            f"    const {it} a_first = tt / {band}u * {group}u;",
            f"    const {it} rows = {tiles_a}u - a_first < {group}u ? {tiles_a}u - a_first : {group}u;",
            f"    const {it} in_band = tt % {band}u;",
            f"    const {it} ta = a_first + in_band % rows;",
            f"    const {it} tb = in_band / rows;",
        ]
    else:
        lines += [
            f"    const {it} tb = t % {tiles_b}u;",
            f"    const {it} tr = t / {tiles_b}u;",
            f"    const {it} ta = tr % {tiles_a}u;",
            f"    const {it} {bvar} = tr / {tiles_a}u;",
        ]
    if not batch:
        return lines + [f"    const {it} in_base = 0u;", f"    const {it} out_base = 0u; (void){bvar};"]
    lines += ["    " + s for s in _decompose(bvar, bshape, it, prefix="q")]
    lines.append(f"    const {it} in_base = " + " + ".join(f"q{j} * {ist[dim]}u" for j, dim in enumerate(batch)) + ";")
    lines.append(f"    const {it} out_base = " + " + ".join(f"q{j} * {ost[dim]}u" for j, dim in enumerate(batch)) + ";")
    return lines


def _decompose(idx: str, shape: Sequence[int], itype: str, prefix: str = "c") -> list[str]:
    """C statements setting ``{prefix}{d}`` to the coordinates of linear index ``idx``."""
    lines = [f"{itype} rem = {idx};"]
    for d in range(len(shape) - 1, -1, -1):
        if d == 0:
            lines.append(f"const {itype} {prefix}{d} = rem;")
        else:
            lines.append(f"const {itype} {prefix}{d} = rem % {shape[d]}u; rem /= {shape[d]}u;")
    return lines


# --------------------------------------------------------------------------------------
# pointwise

Instr = tuple  # ("add", "in0", "t1") / ("mul_scalar", "t0", 0.5) / ("cast", "t2", "bfloat16")

#: CUDA expressions of the elementwise functions (``elementwise_cuda``; a function without one
#: runs with torch): over float registers, and over 64-bit int ones
_BINARY = {name: e.cuda for name, e in BINARY_CUDA.items()}
_UNARY = {name: e.cuda for name, e in UNARY_CUDA.items()}
_INT_FNS = {name: e.int64 for name, e in (*BINARY_CUDA.items(), *UNARY_CUDA.items()) if e.int64}
#: Unary ops with a cheaper form for a value rounded to 16 bits right away (``fast_math``).
_UNARY_16BIT = {name: e.f16 for name, e in UNARY_CUDA.items() if e.f16}
_SCALAR = {"mul_scalar": "({a} * {s})", "add_scalar": "({a} + {s})"}
#: Every pointwise op name (``masked``: ``elementwise_cuda.MASKED_CUDA``).
#: ``in_range`` (dim, lo, hi, a, b): ``a`` where the element's coordinate along dim is in
#: [lo, hi), else ``b`` (a value, or the number 0): a cat's pieces and a pad's zeros
#: (``codegen.fuse``'s moved reads).
#: ``at_index`` (dim, index, a, b): ``a`` where the element's coordinate along dim equals the
#: int value ``index``, else ``b``: an ``unpick`` added into its accumulator
#: (``codegen.unpick_chains``).
POINTWISE_OPS = frozenset(_BINARY) | frozenset(_UNARY) | frozenset(_SCALAR) | {"cast", "masked", "in_range",
                                                                              "at_index"}
#: the instructions that read the element's coordinates (a kernel with a shape)
COORD_OPS = frozenset({"in_range", "at_index"})


def pointwise_vector_width(inputs: Sequence[str], out_dtype: str) -> int:
    """Elements per vector iteration of the vectorized pointwise path (``inputs``: the dtypes of
    the inputs and of any extra outputs).

    One 16-byte load/store for the narrowest dtype involved (wider dtypes use several);
    vectorization applies when n is a multiple of this and every pointer is 16-byte aligned.
    """
    sizes = [ITEMSIZE[_pointwise_dtype(d)] for d in [*inputs, out_dtype]]
    return 16 // min(sizes)


def _operand(tok: object, n_inputs: int, n_done: int, where: str) -> str:
    if isinstance(tok, str) and len(tok) > 2 and tok[:2] == "in" and tok[2:].isdigit():
        k = int(tok[2:])
        if k < n_inputs:
            return f"x{k}"
    elif isinstance(tok, str) and len(tok) > 1 and tok[0] == "t" and tok[1:].isdigit():
        k = int(tok[1:])
        if k < n_done:
            return f"t{k}"
    raise ReshardError(f"pointwise {where}: bad operand {tok!r} (need in0..in{n_inputs - 1} or t0..t{n_done - 1})")


def _rounded_to_16bit(i: int, ops: Sequence[Instr], out_dtype: str, extra: Sequence[tuple[str, str]] = ()) -> bool:
    """Instruction ``i``'s value is only ever rounded to a 16-bit float: it is the result and
    the output is 16-bit, or every later use of it is a cast to a 16-bit dtype, and it is stored
    as an extra output only to 16-bit dtypes."""
    stores = [d for tok, d in extra if tok == f"t{i}"]
    if not all(d in ROUNDS_TO_16BIT for d in stores):
        return False
    if i == len(ops) - 1:
        return out_dtype in ROUNDS_TO_16BIT
    uses = [o for o in ops[i + 1:] if f"t{i}" in o[1:]]
    return bool(uses or stores) and all(o[0] == "cast" and normalize_dtype(o[2]) in ROUNDS_TO_16BIT for o in uses)


def _register(dtype: str) -> str:
    """The C type a pointwise kernel holds a value of ``dtype`` in: ``long long`` for the ints,
    ``float`` for the floats and bool."""
    return "long long" if dtype in _INT_INFO else "float"


def _convert(x: str, from_int: bool, dtype: str) -> str:
    """Register value ``x`` (a 64-bit int when ``from_int``, else a float) as ``dtype`` holds it
    (torch's ``.to``: rounded to a float dtype, ``!= 0`` to bool as 0 or 1, toward zero from a
    float to an int (out of range or NaN: undefined in torch; saturates here), wrapped to 32
    bits to int32), in ``dtype``'s register type."""
    if dtype in _INT_INFO:
        if dtype == "int64":
            return x if from_int else f"((long long)({x}))"
        return f"((long long)(int)({x}))"
    if from_int:
        if dtype == "bool":
            return f"({x} != 0LL ? 1.0f : 0.0f)"
        x = f"((float)({x}))"
    _, tof, fromf, _ = _POINTWISE_INFO[dtype]
    return x if dtype == "float32" else tof.format(x=fromf.format(x=x))


def _stored(x: str, from_int: bool, dtype: str) -> str:
    """The store of register value ``x`` (a 64-bit int when ``from_int``) to a ``dtype`` element."""
    if from_int != (dtype in _INT_INFO):
        x = f"((float)({x}))" if from_int and dtype != "bool" else _convert(x, from_int, dtype)
    return _POINTWISE_INFO[dtype][2].format(x=x)


def _pointwise_body(inputs: Sequence[str], out_dtype: str, ops: Sequence[Instr], extra: Sequence[tuple[str, str]] = (),
                    coord: Callable[[int], str] | None = None
                    ) -> tuple[list[str], str, set[int], bool, dict[str, bool]]:
    """C statements computing t0..tk from x0..x{m-1} (floats, a bool as 0 or 1; an int input, and
    every int value computed from one, a 64-bit int); returns (lines, result, used inputs,
    whether the ``fast_math`` 16-bit functions are called, whether each value ``tK`` / ``xK`` is
    an int).  Int and float values meet only through a ``cast``, or as a comparison's bool
    result.  ``extra``: the (token, dtype) of the extra outputs (a value stored to float32 is
    not computed in a 16-bit form)."""
    lines: list[str] = []
    # ``coord(d)``: the C expression of the element's coordinate along output dim d (``in_range``)
    used: set[int] = set()
    fast16 = False
    is_int_in = [d in _INT_INFO for d in inputs]
    is_int: list[bool] = []  # per instruction

    def opnd(tok: object, i: int) -> tuple[str, bool]:
        v = _operand(tok, len(inputs), i, f"instruction {i} {ops[i]!r}")
        if v[0] == "x":
            used.add(int(v[1:]))
            return v, is_int_in[int(v[1:])]
        return v, is_int[int(v[1:])]

    def fn_expr(i: int, table: dict[str, str], names: list[tuple[str, bool]], result: str | None
                ) -> tuple[str, bool]:
        """A function of ``BINARY_FNS`` / ``UNARY_FNS`` on its operands: its float form, or, on
        int operands, its int form; an int result unless the function's result is bool."""
        op = ops[i][0]
        ints = {k for _, k in names}
        if ints == {True}:
            if op not in _INT_FNS:
                raise ReshardError(f"pointwise instruction {i} {ops[i]!r}: {op} has no int form")
            return _INT_FNS[op].format(**{k: n for k, (n, _) in zip("ab", names)}), result != "bool"
        if True in ints:
            raise ReshardError(f"pointwise instruction {i} {ops[i]!r}: int and float operands (cast one first)")
        return table[op].format(**{k: n for k, (n, _) in zip("ab", names)}), False

    for i, ins in enumerate(ops):
        if not isinstance(ins, (tuple, list)) or not ins:
            raise ReshardError(f"pointwise instruction {i}: expected a tuple, got {ins!r}")
        op = ins[0]
        if op in _BINARY:
            if len(ins) != 3:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: {op} takes two operands")
            expr, ival = fn_expr(i, _BINARY, [opnd(ins[1], i), opnd(ins[2], i)], BINARY_FNS[op].result)
        elif op in _UNARY:
            if len(ins) != 2:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: {op} takes one operand")
            a = opnd(ins[1], i)
            if op in _UNARY_16BIT and not a[1] and _rounded_to_16bit(i, ops, out_dtype, extra):
                expr, ival, fast16 = _UNARY_16BIT[op].format(a=a[0]), False, True
            else:
                expr, ival = fn_expr(i, _UNARY, [a], UNARY_FNS[op].result)
        elif op in _SCALAR:
            if len(ins) != 3 or not isinstance(ins[2], (int, float)):
                raise ReshardError(f"pointwise instruction {i} {ins!r}: {op} takes an operand and a number")
            a, a_int = opnd(ins[1], i)
            if a_int:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: {op} takes a float operand")
            expr, ival = _SCALAR[op].format(a=a, s=_float_literal(ins[2])), False
        elif op == "cast":
            if len(ins) != 3:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: cast takes an operand and a dtype")
            d = _pointwise_dtype(ins[2])
            a, a_int = opnd(ins[1], i)
            expr, ival = _convert(a, a_int, d), d in _INT_INFO
        elif op == "masked":
            if len(ins) != 4 or not isinstance(ins[3], bool):
                raise ReshardError(f"pointwise instruction {i} {ins!r}: masked takes an operand, a condition "
                                   "and a bool")
            (x, ival), (c, c_int) = opnd(ins[1], i), opnd(ins[2], i)
            if c_int:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: masked's condition must be a bool")
            expr = MASKED_CUDA[ins[3]].format(x=x, c=c, zero="0LL" if ival else "0.0f")
        elif op == "in_range":
            if len(ins) != 6 or not all(isinstance(v, int) for v in ins[1:4]):
                raise ReshardError(f"pointwise instruction {i} {ins!r}: in_range takes a dim, lo, hi and two values")
            if coord is None:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: in_range needs the output's coordinates "
                                   "(a kernel with a shape)")
            (a, ival) = opnd(ins[4], i)
            if isinstance(ins[5], (int, float)) and not isinstance(ins[5], bool) and ins[5] == 0:
                b, b_int = ("0LL" if ival else "0.0f"), ival
            else:
                b, b_int = opnd(ins[5], i)
            if b_int != ival:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: in_range of an int and a float value")
            c = coord(ins[1])
            expr = f"(({c} >= {ins[2]}ull && {c} < {ins[3]}ull) ? {a} : {b})"
        elif op == "at_index":
            if len(ins) != 5 or not isinstance(ins[1], int) or isinstance(ins[1], bool):
                raise ReshardError(f"pointwise instruction {i} {ins!r}: at_index takes a dim, an index and two values")
            if coord is None:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: at_index needs the output's coordinates "
                                   "(a kernel with a shape)")
            (k, k_int), (a, ival), (b, b_int) = opnd(ins[2], i), opnd(ins[3], i), opnd(ins[4], i)
            if not k_int or b_int != ival:
                raise ReshardError(f"pointwise instruction {i} {ins!r}: at_index needs an int index and two values "
                                   "of one kind")
            expr = f"(((long long){coord(ins[1])} == {k}) ? {a} : {b})"
        else:
            raise ReshardError(f"pointwise instruction {i}: unknown op {op!r}; known: {sorted(POINTWISE_OPS)}")
        lines.append(f"const {_register('int64' if ival else 'float32')} t{i} = {expr};")
        is_int.append(ival)
    ints = {**{f"x{k}": v for k, v in enumerate(is_int_in)}, **{f"t{k}": v for k, v in enumerate(is_int)}}
    if ops:
        return lines, f"t{len(ops) - 1}", used, fast16, ints
    if not inputs:
        raise ReshardError("pointwise kernel with no inputs and no instructions")
    return lines, "x0", {0}, fast16, ints


def broadcast_strides(in_shape: Sequence[int], dims: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides, over the dims of ``shape``, of a contiguous input of ``in_shape``
    whose dim i sits at result dim ``dims[i]`` (0 along new dims and expanded extent-1 dims):
    the input element of result coordinates c is at ``sum(c[d] * strides[d])``."""
    if len(dims) != len(in_shape) or any(not 0 <= d < len(shape) for d in dims) or len(set(dims)) != len(dims):
        raise ReshardError(f"broadcast of {tuple(in_shape)} to {tuple(shape)}: bad dims {tuple(dims)}")
    out = [0] * len(shape)
    for i, (d, st) in enumerate(zip(dims, row_major_strides(in_shape))):
        if in_shape[i] not in (1, shape[d]):
            raise ReshardError(f"broadcast of {tuple(in_shape)} to {tuple(shape)}: extent {in_shape[i]} of dim {i} "
                               f"is neither 1 nor {shape[d]}")
        out[d] = st if in_shape[i] != 1 else 0
    return tuple(out)


def pointwise_vector_ok(inputs: Sequence[str], out_dtype: str, n: int, shape: Sequence[int] | None = None,
                        bcast: Sequence[tuple] | None = None) -> bool:
    """Whether the 16-byte vector path applies to ``n`` elements (pointers aside): n a
    multiple of the vector width, and every input read shifted along the innermost dim either
    unshifted there (a vector that reaches past its extent takes the per-lane path:
    ``_cut_at``) or shifted by a multiple of the width, its extent there and the innermost
    extent multiples of the width too (a vector never wraps, nor is cut by the clamp; rows
    whose extent is not a multiple are read by vectors that may cross a row:
    ``pointwise_kernel``'s row-crossing lanes)."""
    v = pointwise_vector_width(inputs, out_dtype)
    last = len(shape) - 1 if shape else -1
    shifted = [(sh, n) for rs in _bcast_rolls(bcast, shape).values() for d, sh, n in rs if d == last and sh] \
        if shape else []
    return (n % v == 0 and (not shifted or shape[-1] % v == 0)
            and all(sh % v == 0 and n % v == 0 for sh, n in shifted))


def _cut_at(rolls: dict[int, tuple[tuple[int, int, int], ...]], shape: Sequence[int], v: int) -> int | None:
    """The least extent along the innermost dim of an input read unshifted there but narrower,
    where a vector of ``v`` lanes can straddle it (that extent or the innermost one no multiple
    of ``v``): the vector path reads a vector in one go only below it (else the clamp would move
    its lanes); None: no input is (a vector past the extent reads clamped lanes, unused)."""
    last = len(shape) - 1
    cuts = [n for rs in rolls.values() for d, sh, n in rs
            if d == last and not sh and n < shape[last] and (n % v or shape[last] % v)]
    return min(cuts) if cuts else None


def pointwise_kernel(
    inputs: Sequence[str], out_dtype: str, ops: Sequence[Instr], shape: Sequence[int] | None = None,
    bcast: Sequence[tuple] | None = None, *, vectorize: bool = False, extra: Sequence[tuple[str, str]] = (),
) -> KernelSource:
    """A fused elementwise group ``out[i] = f(in0[i], in1[i], ...)`` over n elements, with
    ``extra`` outputs ``out1[i], out2[i], ...`` of intermediate values.

    Args:
        inputs: dtype of each input (all inputs and the output have n elements, except
            broadcast ones): :data:`POINTWISE_DTYPES` (a bool loads as 0 or 1, an int64 / int32
            as a 64-bit int).
        out_dtype: dtype of the output; the last instruction's value is converted to it (to a
            bool: ``value != 0``, so NaN is True as in torch; to int32: wrapped to 32 bits).
        ops: instructions, evaluated in float32, or, on int operands, in 64-bit ints (the
            functions' ``cuda_int`` forms: ``add sub mul neg abs maximum`` wrap as torch's
            ints do; comparisons give a bool; ``masked`` keeps the int; int and float values
            meet only through ``cast`` or a comparison's bool). Operands are "inK" (input K) or "tK" (the
            result of instruction K). Ops: the functions of ``BINARY_FNS`` (two operands:
            ``add sub mul div maximum``, the comparisons ``eq ne lt le gt ge`` and
            ``logical_and logical_or``, valued 0 or 1) and ``UNARY_FNS`` (one: ``neg exp tanh
            gelu relu silu sigmoid abs sqrt rsqrt log erf logical_not ...``), ``mul_scalar
            add_scalar`` (operand, number), ``masked`` (operand, condition, keep: the operand
            where the condition is ``keep``, else 0), ``cast`` (operand, dtype: rounds to that
            dtype; to bool: 0 or 1). ``gelu`` is the exact erf form
            (torch's default): ``erff`` in float32, or ``fast_math``'s ``rs_gelu16`` where
            its value is only rounded to bfloat16/float16 (correctly rounded for every bf16
            input; the same accuracy in a third fewer instructions). With no ops the output
            is input 0 converted.
        vectorize: emit the 16-byte vector path. The caller guarantees every pointer is
            16-byte aligned and :func:`pointwise_vector_ok`.
        shape, bcast: for inputs read through a broadcast (``codegen.fuse``): the output
            shape (n = its product) and per input ``()`` (read element i) or ``(in_shape,
            dims)`` (a contiguous input of ``in_shape`` whose dim k sits at output dim
            ``dims[k]``, read at :func:`broadcast_strides`; element-wise loads, cached), or
            ``(in_shape, dims, ((dim, shift), ...))``: read shifted along those output dims
            (``_bcast_rolls``: wrapped; clamped in bounds where the input is narrower).  The
            ``in_range`` and ``at_index`` instructions read the output coordinates (a kernel
            with a shape).
        extra: per extra output ``(token, dtype)``: operand ``token``'s value stored to that
            dtype (as the result is to ``out_dtype``).

    Kernel parameters: ``(out, out1, ..., out{e}, in0, ..., in{m-1}, long long n)`` (one
    ``outK`` per extra output); grid from ``grid_for(n)``.
    """
    ins = [_pointwise_dtype(d) for d in inputs]
    od = _pointwise_dtype(out_dtype)
    ops = [tuple(o) for o in ops]
    extra = [(tok, _pointwise_dtype(d)) for tok, d in extra]
    coords = any(o[0] in COORD_OPS for o in ops)
    if coords and shape is None:
        raise ReshardError("pointwise kernel: in_range and at_index need the output shape")
    last = len(shape) - 1 if shape is not None else -1
    body, result, used, fast16, ints = _pointwise_body(ins, od, ops, extra, coord=lambda d: f"c{d}")
    vbody = _pointwise_body(ins, od, ops, extra, coord=lambda d: f"(c{d} + j)" if d == last else f"c{d}")[0]
    stores = [(result, od)] + [(_operand(tok, len(ins), len(ops), f"extra output {k + 1}"), d)
                               for k, (tok, d) in enumerate(extra)]
    for v, _ in stores[1:]:
        if v[0] == "x":
            used.add(int(v[1:]))
    outs = ["out"] + [f"out{k}" for k in range(1, len(stores))]
    stored = [*ins, *(d for _, d in extra)]  # the dtypes besides the result's a vector iteration moves
    norm_ops = [[o[0], *o[1:-1], normalize_dtype(o[-1]) if o[0] == "cast" else o[-1]] if len(o) > 1 else list(o)
                for o in ops]
    strides = _bcast_strides(len(ins), shape, bcast)
    rolls = _bcast_rolls(bcast, shape)
    spec = {"in": ins, "out": od, "ops": norm_ops, "vec": bool(vectorize)}
    if extra:
        spec["extra"] = [list(e) for e in extra]
    if rolls:
        spec["rolls"] = {k: [list(r) for r in v] for k, v in rolls.items()}
    if coords and not strides:
        spec["shape"] = list(shape)
    if strides:
        spec.update(shape=list(shape), strides={k: list(v) for k, v in strides.items()})
    if vectorize and not pointwise_vector_ok(stored, od, _prod(shape) if shape is not None else 0, shape, bcast):
        raise ReshardError(f"pointwise kernel: the vector path cannot read {bcast} over the shape {shape}: a shift "
                           f"along the innermost dim needs it, the shift and the input's extent there multiples of "
                           f"{pointwise_vector_width(stored, od)}")
    name = f"rs_pw_{_spec_hash('pointwise', spec)}"
    params = ", ".join(
        [f"{_POINTWISE_INFO[d][0]}* __restrict__ {o}" for o, (_, d) in zip(outs, stores)]
        + [f"const {_POINTWISE_INFO[d][0]}* __restrict__ in{k}" for k, d in enumerate(ins)] + ["long long n"]
    )
    cast_dts = [normalize_dtype(o[2]) for o in ops if o[0] == "cast"]
    src = ["// generated by reshard.codegen.kernels.pointwise_kernel", _headers([*ins, *(d for _, d in stores), *cast_dts])]
    if fast16:
        src.append(gelu16_source(_float_literal))
    src.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({params}) {{')
    src.append("  const long long stride = (long long)gridDim.x * blockDim.x;")
    if vectorize:
        V = pointwise_vector_width(stored, od)
        src.append(f"  const long long nv = n / {V};")
        src.append("  for (long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {")
        if strides or coords:
            src += ["    " + line for line in _bcast_offsets(f"v * {V}", shape, strides, rolls, V - 1)]
        for k in sorted(used):
            if k in strides:
                continue
            ct = _POINTWISE_INFO[ins[k]][0]
            chunks = V * ITEMSIZE[ins[k]] // 16
            src.append(f"    uint4 r{k}[{chunks}];")
            src.append(f"    #pragma unroll\n    for (int c = 0; c < {chunks}; ++c) "
                       f"r{k}[c] = reinterpret_cast<const uint4*>(in{k})[v * {chunks} + c];")
            src.append(f"    const {ct}* p{k} = reinterpret_cast<const {ct}*>(r{k});")
        for o, (_, d) in zip(outs, stores):
            ct = _POINTWISE_INFO[d][0]
            src.append(f"    uint4 r{o}[{V * ITEMSIZE[d] // 16}];")
            src.append(f"    {ct}* p{o} = reinterpret_cast<{ct}*>(r{o});")
        def lanes(offsets: list[str], at: Callable[[int], str], lines: list[str]) -> list[str]:
            """The loop over a vector's lanes: each lane's offsets, loads, instructions and stores."""
            out = ["#pragma unroll", f"for (int j = 0; j < {V}; ++j) {{"] + ["  " + x for x in offsets]
            out += [f"  const {_register(ins[k])} x{k} = {_POINTWISE_INFO[ins[k]][1].format(x=at(k))};"
                    for k in sorted(used)]
            out += [f"  {x}" for x in lines] + [f"  p{o}[j] = {_stored(v, ints[v], d)};" for o, (v, d) in zip(outs, stores)]
            return out + ["}"]

        in_row = lanes([], lambda k: f"in{k}[o{k} + j * {strides[k][-1]}]" if k in strides else f"p{k}[j]", vbody)
        cut = _cut_at(rolls, shape, V) if shape else None
        if (strides or coords) and (shape[-1] % V or cut is not None):
            # a vector may cross a row, or reach past a narrower input's extent: its lanes in
            # one row and within every input (the common case) as above, else each lane at
            # its own coordinates and offsets
            crossing = lanes(_bcast_offsets(f"v * {V} + j", shape, strides, rolls),
                             lambda k: f"in{k}[o{k}]" if k in strides else f"p{k}[j]", body)
            src.append(f"    if (c{last} + {V - 1}u < {min(shape[-1], cut or shape[-1])}u) {{")
            src += ["      " + line for line in in_row]
            src.append("    } else {")
            src += ["      " + line for line in crossing]
            src.append("    }")
        else:
            src += ["    " + line for line in in_row]
        for o, (_, d) in zip(outs, stores):
            chunks = V * ITEMSIZE[d] // 16
            src.append(f"    #pragma unroll\n    for (int c = 0; c < {chunks}; ++c) "
                       f"reinterpret_cast<uint4*>({o})[v * {chunks} + c] = r{o}[c];")
        src.append("  }")
        ept = V
    else:
        src.append("  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {")
        if strides or coords:
            src += ["    " + line for line in _bcast_offsets("i", shape, strides, rolls)]
        for k in sorted(used):
            at = f"in{k}[o{k}]" if k in strides else f"in{k}[i]"
            src.append(f"    const {_register(ins[k])} x{k} = {_POINTWISE_INFO[ins[k]][1].format(x=at)};")
        src += [f"    {line}" for line in body]
        src += [f"    {o}[i] = {_stored(v, ints[v], d)};" for o, (v, d) in zip(outs, stores)]
        src.append("  }")
        ept = 1
    src.append("}")
    return KernelSource(
        name=name,
        source="\n".join(src) + "\n",
        kind="pointwise",
        params=(*(f"{o}:ptr" for o in outs), *(f"in{k}:ptr" for k in range(len(ins))), "n:i64"),
        block=(BLOCK, 1, 1),
        grid=None,
        elems_per_thread=ept,
    )


def _bcast_strides(n_inputs: int, shape: Sequence[int] | None, bcast: Sequence[tuple] | None
                   ) -> dict[int, tuple[int, ...]]:
    """Input index -> its strides over the output dims, for the broadcast inputs (an input read
    shifted along a dim, ``_bcast_rolls``, may be narrower there than the output)."""
    if not bcast or not any(bcast):
        return {}
    if shape is None or len(bcast) != n_inputs:
        raise ReshardError(f"pointwise kernel: broadcast inputs need the output shape and one entry per input "
                           f"(got shape {shape}, {len(bcast)} entries for {n_inputs} inputs)")
    shape = _check_shape(shape, "pointwise kernel")
    rolls = _bcast_rolls(bcast, shape)
    out = {}
    for k, b in enumerate(bcast):
        if b:
            there = list(shape)
            for d, _, n_in in rolls.get(k, ()):
                there[d] = n_in
            out[k] = broadcast_strides(b[0], b[1], there)
    return out


def _bcast_rolls(bcast: Sequence[tuple] | None, shape: Sequence[int] | None
                 ) -> dict[int, tuple[tuple[int, int, int], ...]]:
    """Input index -> its shifted dims ((output dim, shift, the input's extent there), ...): a
    broadcast entry's optional third element ((dim, shift), ...).  Output coordinate c along
    that dim reads the input at ``w = (c + shift) mod extent`` (the output's extent; a roll),
    or, where the input is narrower there (n), at ``min(w, n - 1)``: an element the caller
    selects only where ``w < n`` (``in_range``), the others read in bounds and unused."""
    out: dict[int, tuple[tuple[int, int, int], ...]] = {}
    for k, b in enumerate(bcast or ()):
        if len(b) > 2 and b[2]:
            got = []
            for d, sh in b[2]:
                dims = list(b[1])
                n_in = tuple(b[0])[dims.index(d)] if d in dims else 0
                if shape is None or not 0 <= d < len(shape) or not 0 <= sh < shape[d] or not 0 < n_in <= shape[d]:
                    raise ReshardError(f"pointwise kernel: input {k}'s shift ({d}, {sh}) does not fit the output "
                                       f"shape {shape} (its shape {tuple(b[0])})")
                got.append((int(d), int(sh), int(n_in)))
            out[k] = tuple(got)
    return out


def _bcast_offsets(first: str, shape: Sequence[int], strides: dict[int, tuple[int, ...]],
                   rolls: dict[int, tuple[tuple[int, int, int], ...]] | None = None, slack: int = 0) -> list[str]:
    """C statements setting ``c{d}``, the coordinates of output element ``first``, and ``o{k}``,
    broadcast input k's offset of it (along a shifted dim, at the coordinate plus the shift,
    wrapped, and clamped to ``n - 1 - slack`` where the input is narrower: ``_bcast_rolls``;
    ``slack``: the vector path's lanes past the first).  The coordinates and offsets are 32-bit
    where every element's index fits in 31 bits (``_idx_type``): the coordinates divide by the
    extents, constants the compiler turns into a multiply and a shift, several times cheaper in
    32 bits than in 64 (a [4096, 50257] bf16 vocab gradient read at 2.3 TB/s with 64-bit ones)."""
    it = _idx_type(_prod(shape))
    u = "u" if it == "unsigned int" else "ull"
    lines = [f"const {it} e0 = ({it})({first});"] + _decompose("e0", shape, it, prefix="c")
    for k, st in strides.items():
        shift = {d: (sh, n) for d, sh, n in (rolls or {}).get(k, ())}
        terms = []
        for d, s in enumerate(st):
            if not s:
                continue
            if d in shift:
                (sh, n), e = shift[d], shape[d]
                c = f"(c{d} + {sh}{u})"
                w = f"({c} < {e}{u} ? {c} : {c} - {e}{u})" if sh else f"c{d}"
                if n < e:  # (the vector path's lanes past the first: never below 0, ``_cut_at``)
                    w = f"min({w}, {max(0, n - 1 - (slack if d == len(shape) - 1 else 0))}{u})"
                terms.append(f"{w} * {s}{u}")
            else:
                terms.append(f"c{d} * {s}{u}")
        lines.append(f"const {it} o{k} = " + (" + ".join(terms) or f"0{u}") + ";")
    return lines


def cast_kernel(n: int | None, src: str, dst: str, *, vectorize: bool = False) -> KernelSource:
    """``out = in.to(dst)``: a one-input pointwise kernel (n is only a runtime parameter).

    If ``vectorize`` is set and ``n`` is given and not a multiple of the vector width,
    the scalar path is emitted instead.
    """
    s, d = _float_dtype(src), _float_dtype(dst)
    if vectorize and n is not None and n % pointwise_vector_width([s], d) != 0:
        vectorize = False
    return pointwise_kernel([s], d, [("cast", "in0", d)] if d != "float32" else [], vectorize=vectorize)


# --------------------------------------------------------------------------------------
# data movement: generic gather (strided copy), permute, pad, cat


def _widen(out_shape: tuple[int, ...], in_strides: tuple[int, ...], in_offset: int, itemsize: int
           ) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """Reinterpret a gather as one over wider units (up to 16 bytes) when the innermost
    dim is contiguous and every size/stride/offset is a multiple of the unit."""
    if not out_shape or in_strides[-1] != 1:
        return out_shape, in_strides, in_offset, itemsize
    for unit in (16, 8, 4, 2):
        if unit <= itemsize:
            break
        w = unit // itemsize
        if out_shape[-1] % w == 0 and in_offset % w == 0 and all(s % w == 0 for s in in_strides[:-1]):
            return (*out_shape[:-1], out_shape[-1] // w), (*(s // w for s in in_strides[:-1]), 1), in_offset // w, unit
    return out_shape, in_strides, in_offset, itemsize


def _merge_gather_dims(shape: Sequence[int], strides: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Drop size-1 dims and merge dims that are contiguous with each other in the input."""
    dims = [(s, st) for s, st in zip(shape, strides) if s != 1]
    merged: list[list[int]] = []
    for s, st in dims:
        if merged and merged[-1][1] == st * s:
            merged[-1] = [merged[-1][0] * s, st]
        else:
            merged.append([s, st])
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged)


def strided_copy_kernel(
    out_shape: Sequence[int], in_strides: Sequence[int], in_offset: int, dtype: str, *, vectorize: bool = False
) -> KernelSource:
    """Contiguous ``out`` = the view of ``in`` with these element strides and offset.

    ``out[c0, ..., ck] = in[in_offset + sum(ci * in_strides[i])]``; covers slices,
    ``as_strided`` views, expand (stride 0) and, with permuted strides, permutes.

    Args:
        vectorize: move 16/8/4-byte units where sizes, strides and offset allow it. The
            caller guarantees both pointers are 16-byte aligned.

    Kernel parameters: ``(out, in)``.
    """
    d = normalize_dtype(dtype)
    shape = _check_shape(out_shape, "strided_copy_kernel")
    strides = tuple(int(s) for s in in_strides)
    if len(strides) != len(shape):
        raise ReshardError(f"strided_copy_kernel: shape {shape} and strides {strides} differ in rank")
    if any(s < 0 for s in strides) or in_offset < 0:
        raise ReshardError(f"strided_copy_kernel: negative stride/offset {strides}/{in_offset}")
    itemsize = ITEMSIZE[d]
    mshape, mstrides = _merge_gather_dims(shape, strides)
    if _prod(shape) == 0:
        mshape, mstrides = (0,), (1,)
    offset = int(in_offset)
    if vectorize:
        mshape, mstrides, offset, itemsize = _widen(mshape, mstrides, offset, itemsize)
    spec = {"shape": mshape, "strides": mstrides, "off": offset, "unit": itemsize}
    name = f"rs_gather_{_spec_hash('gather', spec)}"
    return _gather_source(name, "gather", mshape, mstrides, offset, itemsize)


def _gather_source(name: str, kind: str, shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
                   unit: int) -> KernelSource:
    n = _prod(shape)
    max_off = offset + sum((s - 1) * st for s, st in zip(shape, strides)) if n else 0
    it = _idx_type(n, max_off + 1)
    T = _RAW_TYPE[unit]
    lines = [
        f"// generated by reshard.codegen.kernels ({kind})",
        f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({T}* __restrict__ out, '
        f"const {T}* __restrict__ in) {{",
        f"  const {it} n = {n}u;",
        f"  for ({it} i = blockIdx.x * ({it})blockDim.x + threadIdx.x; i < n; i += ({it})gridDim.x * blockDim.x) {{",
    ]
    if shape:
        lines += ["    " + s for s in _decompose("i", shape, it)]
        terms = [f"c{k} * {st}u" for k, st in enumerate(strides) if st != 0]
        src_off = " + ".join([f"{offset}u", *terms]) if terms else f"{offset}u"
    else:
        src_off = f"{offset}u"
    lines.append(f"    out[i] = in[{src_off}];")
    lines += ["  }", "}"]
    return KernelSource(
        name=name, source="\n".join(lines) + "\n", kind=kind, params=("out:ptr", "in:ptr"),
        block=(BLOCK, 1, 1), grid=(_grid1d(n, BLOCK), 1, 1),
    )


def _collapse_perm(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Drop size-1 dims and merge input dims that stay adjacent and in order in the output.

    Returns (collapsed input shape, collapsed perm) with the same semantics.
    """
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    rank_of = {d: i for i, d in enumerate(keep)}
    s = [shape[d] for d in keep]
    p = [rank_of[d] for d in perm if d in rank_of]
    groups: list[list[int]] = []
    for d in p:
        if groups and groups[-1][-1] + 1 == d:
            groups[-1].append(d)
        else:
            groups.append([d])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])  # groups in input order
    new_shape = tuple(_prod([s[d] for d in groups[g]]) for g in order)
    pos = {g: i for i, g in enumerate(order)}
    new_perm = tuple(pos[g] for g in range(len(groups)))
    return new_shape, new_perm


def permute_kernel(shape: Sequence[int], perm: Sequence[int], dtype: str, *, vectorize: bool = False) -> KernelSource:
    """``out = in.permute(perm).contiguous()`` for a contiguous ``in`` of ``shape``.

    Dims are first collapsed (size-1 dims dropped, runs that stay adjacent merged).  If the
    innermost input dim stays innermost, this is a coalesced index-arithmetic copy (see
    :func:`strided_copy_kernel`; ``vectorize`` as there).  Otherwise it is a 32x32
    shared-memory tiled transpose (tile padded to 33 columns) between the input dim that
    becomes innermost and the input's innermost dim, looping over all other ("batch") dims.

    With ``vectorize`` (the caller guarantees 16-byte aligned pointers), 2- and 4-byte dtypes
    (:data:`TRANSPOSE_VEC_ITEMSIZES`) whose two tiled extents are multiples of the 16-byte
    vector use :func:`_transpose_vec_kernel` instead: 16-byte global loads and stores
    (2-byte elements moved as packed pairs).  Anything else keeps the 32x32 element tile.

    Kernel parameters: ``(out, in)``.
    """
    d = normalize_dtype(dtype)
    shp = _check_shape(shape, "permute_kernel")
    pm = tuple(int(p) for p in perm)
    if sorted(pm) != list(range(len(shp))):
        raise ReshardError(f"permute_kernel: {pm} is not a permutation of {len(shp)} dims")
    cshape, cperm = _collapse_perm(shp, pm)
    k = len(cshape)
    if _prod(shp) == 0 or k <= 1 or cperm[-1] == k - 1:
        ist = row_major_strides(cshape)
        out_shape = tuple(cshape[p] for p in cperm) if _prod(shp) else (0,)
        out_strides = tuple(ist[p] for p in cperm) if _prod(shp) else (1,)
        return strided_copy_kernel(out_shape, out_strides, 0, d, vectorize=vectorize)

    itemsize = ITEMSIZE[d]
    if vectorize and _transpose_vec_ok(cshape, cperm, itemsize):
        return _transpose_vec_kernel(cshape, cperm, itemsize)
    spec = {"shape": cshape, "perm": cperm, "item": itemsize}
    name = f"rs_transpose_{_spec_hash('permute_tiled', spec)}"
    ist = row_major_strides(cshape)
    out_shape = tuple(cshape[p] for p in cperm)
    ost_out = row_major_strides(out_shape)
    ost = [0] * k  # output stride of each input dim
    for pos, dim in enumerate(cperm):
        ost[dim] = ost_out[pos]
    A, B = cperm[-1], k - 1
    SA, SB = cshape[A], cshape[B]
    batch = [dim for dim in cperm if dim not in (A, B)]
    bshape = [cshape[dim] for dim in batch]
    nb = _prod(bshape)
    tiles_a, tiles_b = _ceil_div(SA, 32), _ceil_div(SB, 32)
    total = nb * tiles_a * tiles_b
    n = _prod(cshape)
    it = _idx_type(n, total)
    T = _RAW_TYPE[itemsize]
    ST = "unsigned long long" if itemsize == 8 else "unsigned int"  # 4-byte+ shared words: no bank conflicts
    lines = [
        "// generated by reshard.codegen.kernels.permute_kernel (tiled transpose)",
        f"// shape {cshape} perm {cperm}: tile over input dims {A} (-> out innermost) and {B} (in innermost)",
        f'extern "C" __global__ void __launch_bounds__(256) {name}({T}* __restrict__ out, '
        f"const {T}* __restrict__ in) {{",
        f"  __shared__ {ST} tile[32][33];",
    ]
    lines += _tile_loop(it, total, tiles_a, tiles_b, "b", batch, bshape, ist, ost)
    lines += [
        f"    const {it} a0 = ta * 32u, b0 = tb * 32u;",
        "    #pragma unroll",
        "    for (int j = threadIdx.y; j < 32; j += 8) {",
        f"      const {it} a = a0 + j, bb = b0 + threadIdx.x;",
        f"      if (a < {SA}u && bb < {SB}u) tile[j][threadIdx.x] = in[in_base + a * {ist[A]}u + bb];",
        "    }",
        "    __syncthreads();",
        "    #pragma unroll",
        "    for (int j = threadIdx.y; j < 32; j += 8) {",
        f"      const {it} bb = b0 + j, a = a0 + threadIdx.x;",
        f"      if (a < {SA}u && bb < {SB}u) out[out_base + bb * {ost[B]}u + a] = ({T})tile[threadIdx.x][j];",
        "    }",
        "    __syncthreads();",
        "  }",
        "}",
    ]
    return KernelSource(
        name=name, source="\n".join(lines) + "\n", kind="permute_tiled", params=("out:ptr", "in:ptr"),
        block=(32, 8, 1), grid=(max(1, min(total, MAX_GRID)), 1, 1),
    )


def _transpose_vec_ok(cshape: tuple[int, ...], cperm: tuple[int, ...], itemsize: int) -> bool:
    """Whether :func:`permute_kernel` uses :func:`_transpose_vec_kernel` for a collapsed
    transpose: an item size in :data:`TRANSPOSE_VEC_ITEMSIZES` and both tiled extents (the
    input dim that becomes innermost, and the input's innermost dim) multiples of the
    16-byte vector."""
    if itemsize not in TRANSPOSE_VEC_ITEMSIZES or len(cshape) < 2 or cperm[-1] == len(cshape) - 1:
        return False
    v = 16 // itemsize
    return cshape[cperm[-1]] % v == 0 and cshape[-1] % v == 0


#: B-tiles one block moves per loop iteration of the 16-byte transpose, per item size
#: (all their global loads are issued before the first shared-memory store).
TRANSPOSE_UNROLL: dict[int, int] = {2: 1, 4: 2}
#: Item sizes :func:`permute_kernel` moves with the 16-byte transpose.  H100, 256 MiB
#: (docs/history/gpu-check-2026-11.md, scripts/bench_transpose.py): bf16 2-D 74% -> 90-92% of copy, (0, 2, 1)
#: 81% -> 96-98%; fp32 there: the scalar 32x32 tile 93% / 98-99%, the 16-byte tile the same.
#: H200 (4.1 TB/s copy; docs/history/benchmarks-2026-11.md): fp32 2-D scalar tile 83.6%, 16-byte tile 85.8%
#: (unroll 1) / 88.5% (unroll 2); (0, 2, 1) 90.7% -> 94.0% / 97.5%: so fp32 takes the
#: 16-byte tile with 2 tiles per iteration; bf16 gains nothing from unrolling (86.7 / 86.3%).
TRANSPOSE_VEC_ITEMSIZES: tuple[int, ...] = (2, 4)
#: Tile rows per band of the 16-byte transpose's tile order (``_tile_loop``; 0: row by row).
#: H200, 256 MiB (scripts/bench_transpose.py, docs/history/benchmarks-2026-11.md): wide 2-D transposes gain
#: (bf16 2896 x 46336: 84.4% -> 90.1-91.5% of copy; fp32 2048 x 32768: 88.2% -> 91.8-92.9%),
#: the square, tall and batched ones move by at most about a point either way (run-to-run noise).
TRANSPOSE_GROUP = 32


def _transpose_vec_kernel(cshape: tuple[int, ...], cperm: tuple[int, ...], itemsize: int,
                          unroll: int | None = None, group: int | None = None) -> KernelSource:
    """Tiled transpose with 16-byte global accesses (collapsed ``cshape``/``cperm``; see
    :func:`_transpose_vec_ok` for when it applies; pointers must be 16-byte aligned).

    Let A be the input dim that becomes the output's innermost and B the input's innermost
    dim, V = 16 / itemsize elements per vector and w = 4 / itemsize elements per 32-bit word.
    A tile covers 32w values of A x 8V values of B (64 x 64 for 2-byte items, 32 x 32 for
    4-byte ones); a block of 256 threads moves ``unroll`` tiles adjacent along B per loop
    iteration (default :data:`TRANSPOSE_UNROLL`):

    1. thread (p, g) loads w 16-byte vectors per tile: rows a = a0 + w p + e (e < w), columns
       b0 + V g .. + V; for 2-byte items the two rows are interleaved into 32-bit words
       (``__byte_perm``) so that word k holds the elements (a, b) and (a + 1, b) that are
       adjacent in the output;
    2. the words go to ``tile[b - b0][word column p]``, whose 4-word chunks are XOR-swizzled
       by ``(b - b0) / V`` so that these stores and the 16-byte reads below hit distinct banks;
    3. each thread reads 16-byte chunks (V consecutive values of A at one b) and writes each
       as one 16-byte store to the output row of b.

    Both extents are multiples of V, so edge tiles only skip whole vectors.

    Kernel parameters: ``(out, in)``.
    """
    k = len(cshape)
    V, w = 16 // itemsize, 4 // itemsize
    U = int(unroll or TRANSPOSE_UNROLL.get(itemsize, 1))
    TA, TB = 32 * w, 8 * V
    G = TRANSPOSE_GROUP if group is None else int(group)
    spec = {"shape": cshape, "perm": cperm, "item": itemsize, "v": "vec16", "unroll": U, "group": G}
    name = f"rs_transpose_v_{_spec_hash('permute_tiled_vec', spec)}"
    ist = row_major_strides(cshape)
    out_shape = tuple(cshape[p] for p in cperm)
    ost_out = row_major_strides(out_shape)
    ost = [0] * k
    for pos, dim in enumerate(cperm):
        ost[dim] = ost_out[pos]
    A, B = cperm[-1], k - 1
    SA, SB = cshape[A], cshape[B]
    batch = [dim for dim in cperm if dim not in (A, B)]
    bshape = [cshape[dim] for dim in batch]
    nb = _prod(bshape)
    tiles_a, tiles_b = _ceil_div(SA, TA), _ceil_div(SB, TB * U)
    total = nb * tiles_a * tiles_b
    n = _prod(cshape)
    it = _idx_type(n, total)
    T = _RAW_TYPE[itemsize]
    lines = [
        "// generated by reshard.codegen.kernels._transpose_vec_kernel (16-byte tiled transpose)",
        f"// shape {cshape} perm {cperm}: tile {TA} (input dim {A}) x {TB} (input dim {B}) x {U}, item {itemsize} B",
        f'extern "C" __global__ void __launch_bounds__(256) {name}({T}* __restrict__ out, '
        f"const {T}* __restrict__ in) {{",
        f"  __shared__ __align__(16) unsigned int tile[{U}][{TB}][32];",
        "  const unsigned int tid = threadIdx.x, g = tid & 7u, p = tid >> 3;",
    ]
    lines += _tile_loop(it, total, tiles_a, tiles_b, "bi", batch, bshape, ist, ost, G)
    lines += [
        f"    const {it} a0 = ta * {TA}u, b0 = tb * {TB * U}u;",
        f"    const {it} a = a0 + {w}u * p;",
        f"    uint4 u[{U}][{w}];",
        "    #pragma unroll",
        f"    for (int m = 0; m < {U}; ++m) {{",
        f"      const {it} b = b0 + m * {TB}u + {V}u * g;",
        f"      if (a < {SA}u && b < {SB}u) {{",
        "        #pragma unroll",
        f"        for (int e = 0; e < {w}; ++e) "
        f"u[m][e] = *reinterpret_cast<const uint4*>(in + in_base + (a + e) * {ist[A]}u + b);",
        "      }",
        "    }",
        "    #pragma unroll",
        f"    for (int m = 0; m < {U}; ++m) {{",
        f"      if (a < {SA}u && b0 + m * {TB}u + {V}u * g < {SB}u) {{",
    ]
    swz = "(((p >> 2) ^ g) << 2) + (p & 3u)"
    if w == 1:
        for c, comp in enumerate("xyzw"):
            lines.append(f"        tile[m][{V}u * g + {c}u][{swz}] = u[m][0].{comp};")
    else:
        for c, comp in enumerate("xyzw"):
            lines.append(f"        tile[m][{V}u * g + {2 * c}u][{swz}] = __byte_perm(u[m][0].{comp}, u[m][1].{comp}, 0x5410);")
            lines.append(f"        tile[m][{V}u * g + {2 * c + 1}u][{swz}] = __byte_perm(u[m][0].{comp}, u[m][1].{comp}, 0x7632);")
    lines += [
        "      }",
        "    }",
        "    __syncthreads();",
        "    #pragma unroll",
        f"    for (unsigned int rr = p; rr < {TB * U}u; rr += 32u) {{",
        f"      const unsigned int m = rr / {TB}u, r = rr % {TB}u;",
        f"      const {it} bb = b0 + rr, aa = a0 + {V}u * g;",
        f"      if (bb < {SB}u && aa < {SA}u) {{",
        f"        const uint4 v = *reinterpret_cast<const uint4*>(&tile[m][r][(g ^ ((r / {V}u) & 7u)) << 2]);",
        f"        *reinterpret_cast<uint4*>(out + out_base + bb * {ost[B]}u + aa) = v;",
        "      }",
        "    }",
        "    __syncthreads();",
        "  }",
        "}",
    ]
    return KernelSource(
        name=name, source="\n".join(lines) + "\n", kind="permute_tiled_vec", params=("out:ptr", "in:ptr"),
        block=(256, 1, 1), grid=(max(1, min(total, MAX_GRID)), 1, 1),
    )


def _fill_bits(value: float, dtype: str) -> int:
    """Bit pattern of ``value`` in ``dtype`` (as the raw unsigned integer the kernels move)."""
    import torch  # local: keep this module importable without torch

    t = torch.tensor([value], dtype=getattr(torch, dtype))
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[ITEMSIZE[dtype]]
    return int(t.view(raw).item()) & ((1 << (8 * ITEMSIZE[dtype])) - 1)


def pad_kernel(in_shape: Sequence[int], pads: Sequence[tuple[int, int]], dtype: str, value: float = 0.0
               ) -> KernelSource:
    """Contiguous ``out`` = contiguous ``in`` padded with ``value``.

    ``pads[d] = (before, after)`` elements for dim d (one pair per dim, in dim order; a
    negative amount crops). Output shape: ``in_shape[d] + before + after``.

    Kernel parameters: ``(out, in)``.
    """
    d = normalize_dtype(dtype)
    shp = _check_shape(in_shape, "pad_kernel")
    pp = tuple((int(a), int(b)) for a, b in pads)
    if len(pp) != len(shp):
        raise ReshardError(f"pad_kernel: {len(pp)} pad pairs for a rank-{len(shp)} shape {shp}")
    out_shape = tuple(s + a + b for s, (a, b) in zip(shp, pp))
    if any(s < 0 for s in out_shape):
        raise ReshardError(f"pad_kernel: pads {pp} crop shape {shp} below zero")
    itemsize = ITEMSIZE[d]
    fill = _fill_bits(value, d)
    if len(shp) >= 1 and all(a == b == 0 for a, b in pp[:-1]) and _prod(out_shape):
        return _pad_rows_source(_prod(shp[:-1]), shp[-1], pp[-1], itemsize, fill)
    spec = {"shape": shp, "pads": pp, "item": itemsize, "fill": fill}
    name = f"rs_pad_{_spec_hash('pad', spec)}"
    n = _prod(out_shape)
    ist = row_major_strides(shp)
    T = _RAW_TYPE[itemsize]
    it = "long long"  # signed: input coordinates can be negative
    lines = [
        "// generated by reshard.codegen.kernels.pad_kernel",
        f"// in {shp} pads {pp} -> out {out_shape}",
        f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({T}* __restrict__ out, '
        f"const {T}* __restrict__ in) {{",
        f"  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < {n}LL; "
        "i += (long long)gridDim.x * blockDim.x) {",
    ]
    if shp:
        lines += ["    " + s for s in _decompose("i", out_shape, it)]
        conds, terms = [], []
        for k, (s, (a, _)) in enumerate(zip(shp, pp)):
            lines.append(f"    const long long s{k} = c{k} - ({a}LL);")
            conds.append(f"s{k} >= 0 && s{k} < {s}LL")
            terms.append(f"s{k} * {ist[k]}LL")
        lines.append(f"    const bool inb = {' && '.join(conds)};")
        lines.append(f"    out[i] = inb ? in[{' + '.join(terms)}] : ({T}){fill}ull;")
    else:
        lines.append("    out[i] = in[0];")
    lines += ["  }", "}"]
    return KernelSource(
        name=name, source="\n".join(lines) + "\n", kind="pad", params=("out:ptr", "in:ptr"),
        block=(BLOCK, 1, 1), grid=(_grid1d(n, BLOCK), 1, 1),
    )


#: elements of a row each thread of ``_pad_rows_source`` moves (loads first, then stores)
PAD_ROW_UNROLL = 8


def _pad_rows_source(rows: int, cols: int, pad: tuple[int, int], itemsize: int, fill: int) -> KernelSource:
    """``pad_kernel`` padding (or cropping) only the last dim: ``rows`` rows of ``cols``
    elements to rows of ``cols + lo + hi`` (``pad = (lo, hi)``), out[r, j] = in[r, j - lo] where
    that is in the row, else ``fill``.  A block moves ``PAD_ROW_UNROLL`` x ``BLOCK`` consecutive
    elements of one row (consecutive threads, consecutive elements: coalesced), with no division
    per element: the general kernel's per-element coordinates ran a [4096, 50257] bfloat16 pad
    at 2.4x a plain copy's time (the lm head's GEMMs pad their operands, ``codegen.aligned_matmuls``)."""
    lo, hi = pad
    out_cols, span = cols + lo + hi, BLOCK * PAD_ROW_UNROLL
    chunks = _ceil_div(out_cols, span)
    spec = {"rows": rows, "cols": cols, "pad": pad, "item": itemsize, "fill": fill}
    name = f"rs_padrows_{_spec_hash('padrows', spec)}"
    T = _RAW_TYPE[itemsize]
    it = _idx_type(rows * chunks, rows * max(cols, out_cols))
    lines = [
        "// generated by reshard.codegen.kernels.pad_kernel (rows)",
        f"// {rows} rows of {cols} -> {out_cols} (last dim padded by {pad})",
        f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({T}* __restrict__ out, '
        f"const {T}* __restrict__ in) {{",
        f"  for ({it} b = blockIdx.x; b < {rows * chunks}u; b += gridDim.x) {{",
        f"    const {it} r = b / {chunks}u;",
        f"    const long long j0 = (long long)(b - r * {chunks}u) * {span} + threadIdx.x;",
        f"    const {T}* src = in + r * ({it}){cols}u;",
        f"    {T}* dst = out + r * ({it}){out_cols}u;",
        f"    {T} v[{PAD_ROW_UNROLL}];",
        "    #pragma unroll",
        f"    for (int u = 0; u < {PAD_ROW_UNROLL}; ++u) {{",
        f"      const long long s = j0 + u * {BLOCK} - ({lo}LL);",
        f"      v[u] = s >= 0 && s < {cols}LL ? src[s] : ({T}){fill}ull;",
        "    }",
        "    #pragma unroll",
        f"    for (int u = 0; u < {PAD_ROW_UNROLL}; ++u) {{",
        f"      const long long j = j0 + u * {BLOCK};",
        f"      if (j < {out_cols}LL) dst[j] = v[u];",
        "    }",
        "  }",
        "}",
    ]
    return KernelSource(
        name=name, source="\n".join(lines) + "\n", kind="pad_rows", params=("out:ptr", "in:ptr"),
        block=(BLOCK, 1, 1), grid=(max(1, min(rows * chunks, MAX_GRID)), 1, 1),
    )


def _local_row(extent: int, masked: bool) -> str:
    """C statements reading global index ``id`` from ``idx[t]`` and setting ``r``, the row of
    the rank's block it names: ``id`` itself, or with ``masked`` its position ``pos[id]`` among
    the rank's rows (-1: another rank holds it; ``pos`` has ``extent`` entries); -1 for an index
    outside ``[0, extent)`` (nothing is read at it)."""
    row = "pos[id]" if masked else "id"
    return (f"    const long long id = idx[t];\n"
            f"    const long long r = (unsigned long long)id < {extent}ull ? {row} : -1LL;")


def _indexed_kernel(builder: str, name: str, kind: str, out: tuple[str, str], data: tuple[str, str], masked: bool,
                    extent: int, n: int, token: str, body: str, headers: str = "") -> KernelSource:
    """The frame the lookup and scatter kernels share: parameters ``out`` and ``data`` (each a C
    type and a name), the int64 indices ``idx`` and with ``masked`` the rank's row positions
    ``pos``; a grid-stride loop over ``n`` items whose C statement ``token`` sets ``t``, the
    item's index position; the row ``r`` that index names (:func:`_local_row`); then ``body``."""
    it = _idx_type(n)
    pos = ", const long long* __restrict__ pos" if masked else ""
    lines = [
        f"// generated by reshard.codegen.kernels.{builder}",
        headers,
        f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({out[0]}* __restrict__ {out[1]}, '
        f"const {data[0]}* __restrict__ {data[1]}, const long long* __restrict__ idx{pos}) {{",
        f"  for ({it} i = blockIdx.x * ({it})blockDim.x + threadIdx.x; i < {n}ull; "
        f"i += ({it})gridDim.x * blockDim.x) {{",
        f"    const {it} {token}",
        _local_row(extent, masked),
        f"    {body}",
        "  }",
        "}",
    ]
    return KernelSource(name=name, source="\n".join(lines) + "\n", kind=kind,
                        params=(f"{out[1]}:ptr", f"{data[1]}:ptr", "idx:ptr", *(("pos:ptr",) if masked else ())),
                        grid=(_grid1d(n, BLOCK), 1, 1))


def unpick_kernel(rows: int, width: int, extent: int, dtype: str, masked: bool) -> KernelSource:
    """``out[t, v] = g[t]`` where ``v`` is the row of the rank's block that ``idx[t]`` names
    (:func:`_local_row`), else 0, for ``t < rows`` and ``v < width``: the scatter of one value per
    row (``reshard.ir.ops.lookup``'s ``unpick``, pick's backward), each output element written
    once; with ``masked`` (the masked local scatter) an index of a column another rank holds
    writes nothing here.  Moves bits, so any dtype of :data:`ITEMSIZE` (0: every bit clear).

    Kernel parameters: ``(out, g, idx)``, then ``pos`` when ``masked``.
    """
    d = normalize_dtype(dtype)
    rows, width, extent = int(rows), int(width), int(extent)
    if rows < 0 or width < 0 or extent < 0:
        raise ReshardError(f"unpick_kernel: negative rows {rows}, width {width} or extent {extent}")
    T = _RAW_TYPE[ITEMSIZE[d]]
    spec = {"rows": rows, "width": width, "extent": extent, "item": ITEMSIZE[d], "masked": bool(masked)}
    w = max(width, 1)
    return _indexed_kernel("unpick_kernel", f"rs_unpick_{_spec_hash('unpick', spec)}", "unpick", (T, "out"), (T, "g"),
                           masked, extent, rows * width, f"t = i / {w}u;",
                           f"out[i] = r == (long long)(i % {w}u) ? g[t] : ({T})0;")


def unpick_add_kernel(rows: int, width: int, extent: int, dtype: str, masked: bool) -> KernelSource:
    """``out[t, v] += g[t]`` where ``v`` is the row of the rank's block that ``idx[t]`` names
    (:func:`_local_row`; none: nothing), for ``t < rows``: an ``unpick`` added to its
    accumulator (``codegen.scatter_add``) where ``out`` already holds the accumulator, one
    thread per row, so the block's other elements are neither read nor written.  The sum is
    the pointwise add's (float32, rounded to ``dtype``, a float dtype of :data:`FLOAT_DTYPES`).

    Kernel parameters: ``(out, g, idx)``, then ``pos`` when ``masked``.
    """
    d = _float_dtype(dtype)
    rows, width, extent = int(rows), int(width), int(extent)
    if rows < 0 or width < 0 or extent < 0:
        raise ReshardError(f"unpick_add_kernel: negative rows {rows}, width {width} or extent {extent}")
    ct, tof, fromf, _ = _FLOAT_INFO[d]
    spec = {"rows": rows, "width": width, "extent": extent, "dtype": d, "masked": bool(masked)}
    it = _idx_type(rows * max(width, 1))
    at = f"out[({it})t * {max(width, 1)}u + ({it})r]"
    total = f"__fadd_rn({tof.format(x=at)}, {tof.format(x='g[t]')})"
    return _indexed_kernel("unpick_add_kernel", f"rs_unpick_add_{_spec_hash('unpick_add', spec)}", "unpick_add",
                           (ct, "out"), (ct, "g"), masked, extent, rows, "t = i;",
                           f"if (r >= 0) {at} = {fromf.format(x=total)};", _headers([d]))


def fill_kernel(n: int, dtype: str, value: float = 0.0) -> KernelSource:
    """``out[i] = value`` (as ``dtype`` holds it: torch's conversion; 0: every bit clear) for
    ``n`` items of ``dtype``.

    Kernel parameters: ``(out)``.
    """
    d, n = normalize_dtype(dtype), int(n)
    if n < 0:
        raise ReshardError(f"fill_kernel: negative count {n}")
    T, bits = _RAW_TYPE[ITEMSIZE[d]], _fill_bits(value, d)
    it = _idx_type(n)
    name = f"rs_fill_{_spec_hash('fill', {'n': n, 'item': ITEMSIZE[d], 'bits': bits})}"
    src = ("// generated by reshard.codegen.kernels.fill_kernel\n"
           f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({T}* __restrict__ out) {{\n'
           f"  for ({it} i = blockIdx.x * ({it})blockDim.x + threadIdx.x; i < {n}ull; "
           f"i += ({it})gridDim.x * blockDim.x) out[i] = ({T}){bits}ull;\n}}\n")
    return KernelSource(name=name, source=src, kind="fill", params=("out:ptr",), grid=(_grid1d(n, BLOCK), 1, 1))


def _lookup_unit(itemsize: int, width: int, base: int) -> int:
    """The widest unit (up to 16 bytes) whose size divides a row's bytes and the row base's."""
    for unit in (16, 8, 4, 2):
        if unit > itemsize and width * itemsize % unit == 0 and base * itemsize % unit == 0:
            return unit
    return itemsize


def lookup_kernel(tokens: int, width: int, base: int, extent: int, dtype: str, masked: bool, *,
                  vectorize: bool = False) -> KernelSource:
    """``out[t, h] = table[t * base + r(t) * width + h]`` for ``t < tokens``, ``h < width``,
    where ``r(t)`` is the table row index ``idx[t]`` names, and 0 (every bit clear) where it
    names none (:func:`_local_row`): a gather of one row of ``width`` elements per index (``reshard.ir.ops.lookup``'s
    forward lookups: ``embedding``, rows of a ``[V, H]`` table, ``base`` 0; ``pick``, one element
    of each row of ``x [B, V]``, ``width`` 1 and ``base`` V).  ``idx`` (int64, one per token)
    holds global indices in ``[0, extent)``; ``masked`` (the masked local lookup of a table
    split along V): ``r = pos[idx[t]]``, ``pos`` (int64, ``extent`` of them) the position of
    each global row among the rank's rows, -1 where another rank holds it; else ``r = idx[t]``.
    An index outside ``[0, extent)`` names no row (the op requires it in range; the kernel
    never reads outside ``idx``, ``pos`` or ``table``).  Moves bits, so any dtype of
    :data:`ITEMSIZE`.

    Args:
        vectorize: move rows in 16/8/4/2-byte units where ``width`` and ``base`` allow; the
            caller guarantees ``out`` and ``table`` are 16-byte aligned.

    Kernel parameters: ``(out, table, idx)``, then ``pos`` when ``masked``.
    """
    d = normalize_dtype(dtype)
    tokens, width, base, extent = int(tokens), int(width), int(base), int(extent)
    if tokens < 0 or width < 0 or base < 0 or extent < 0:
        raise ReshardError(f"lookup_kernel: negative tokens {tokens}, width {width}, base {base} or extent {extent}")
    unit = _lookup_unit(ITEMSIZE[d], width, base) if vectorize else ITEMSIZE[d]
    w, b = width * ITEMSIZE[d] // unit, base * ITEMSIZE[d] // unit  # in units
    T = _RAW_TYPE[unit]
    zero = "make_uint4(0u, 0u, 0u, 0u)" if unit == 16 else f"({T})0"
    spec = {"tokens": tokens, "w": w, "b": b, "extent": extent, "unit": unit, "masked": bool(masked)}
    return _indexed_kernel("lookup_kernel", f"rs_lookup_{_spec_hash('lookup', spec)}", "lookup", (T, "out"),
                           (T, "table"), masked, extent, tokens * w, f"t = i / {max(w, 1)}u, h = i % {max(w, 1)}u;",
                           f"out[i] = r >= 0 ? table[(long long)t * {b}LL + r * {w}LL + (long long)h] : {zero};")


def embedding_grad_kernel(tokens: int, width: int, extent: int, dtype: str, masked: bool,
                          padding_idx: int | None = None) -> KernelSource:
    """``acc[r(t), h] += g[t, h]`` for ``t < tokens``, ``h < width``, ``r(t)`` the row of the
    rank's block that ``idx[t]`` names (:func:`_local_row`; with ``masked``, the masked local
    scatter, a row another rank holds takes nothing here): the rows of ``g`` summed into the
    rows the ids name (``reshard.ir.ops.lookup``'s ``embedding_grad``, embedding's backward), by
    float32 atomics into ``acc`` (zeroed before: :func:`fill_kernel`; the order of the additions
    varies, as in torch's ``index_add_`` on a GPU).  Tokens whose id is ``padding_idx`` add
    nothing.  ``g``: float32, bfloat16 or float16.

    Kernel parameters: ``(acc, g, idx)``, then ``pos`` when ``masked``.
    """
    d = _float_dtype(dtype)
    tokens, width, extent = int(tokens), int(width), int(extent)
    if tokens < 0 or width < 1 or extent < 0:
        raise ReshardError(f"embedding_grad_kernel: bad tokens {tokens}, width {width} or extent {extent}")
    ct, tof, _, _ = _FLOAT_INFO[d]
    spec = {"tokens": tokens, "width": width, "extent": extent, "dtype": d, "masked": bool(masked),
            "pad": padding_idx}
    adds = "r >= 0" if padding_idx is None else f"r >= 0 && id != {int(padding_idx)}LL"
    return _indexed_kernel("embedding_grad_kernel", f"rs_embgrad_{_spec_hash('embedding_grad', spec)}",
                           "embedding_grad", ("float", "acc"), (ct, "g"), masked, extent, tokens * width,
                           f"t = i / {width}u;",
                           f"if ({adds}) atomicAdd(acc + r * {width}LL + (long long)(i % {width}u), "
                           f"{tof.format(x='g[i]')});", _headers([d]))


def cat_kernel(in_shapes: Sequence[Sequence[int]], dim: int, dtype: str) -> KernelSource:
    """Contiguous ``out = torch.cat(ins, dim)`` of k contiguous inputs.

    All shapes must agree except along ``dim`` (negative dims count from the end).

    Kernel parameters: ``(out, in0, ..., in{k-1})``.
    """
    d = normalize_dtype(dtype)
    shapes = [_check_shape(s, "cat_kernel") for s in in_shapes]
    if not shapes:
        raise ReshardError("cat_kernel: no inputs")
    r = len(shapes[0])
    dm = dim + r if dim < 0 else dim
    if not 0 <= dm < r:
        raise ReshardError(f"cat_kernel: dim {dim} out of range for rank {r}")
    for s in shapes:
        if len(s) != r or any(s[j] != shapes[0][j] for j in range(r) if j != dm):
            raise ReshardError(f"cat_kernel: shapes {shapes} differ outside dim {dm}")
    outer = _prod(shapes[0][:dm])
    inner = _prod(shapes[0][dm + 1:])
    widths = [s[dm] * inner for s in shapes]  # row width of each input in the (outer, width) view
    total_w = sum(widths)
    n = outer * total_w
    itemsize = ITEMSIZE[d]
    spec = {"outer": outer, "widths": widths, "item": itemsize}
    name = f"rs_cat_{_spec_hash('cat', spec)}"
    it = _idx_type(n)
    T = _RAW_TYPE[itemsize]
    params = ", ".join([f"{T}* __restrict__ out"] + [f"const {T}* __restrict__ in{k}" for k in range(len(shapes))])
    lines = [
        "// generated by reshard.codegen.kernels.cat_kernel",
        f"// cat {shapes} along dim {dm}",
        f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({params}) {{',
        f"  for ({it} i = blockIdx.x * ({it})blockDim.x + threadIdx.x; i < {n}u; i += ({it})gridDim.x * blockDim.x) {{",
        f"    const {it} row = i / {max(total_w, 1)}u, col = i % {max(total_w, 1)}u;",
    ]
    start = 0
    branches = []
    for k, w in enumerate(widths):
        if w == 0:
            continue
        branches.append((k, start, w))
        start += w
    for j, (k, st, w) in enumerate(branches):
        kw = "if" if j == 0 else "else if"
        cond = f"(col < {st + w}u)" if j < len(branches) - 1 else ""
        if j == len(branches) - 1:
            lines.append(f"    {'else ' if j else ''}{{ out[i] = in{k}[row * {w}u + (col - {st}u)]; }}")
        else:
            lines.append(f"    {kw} {cond} {{ out[i] = in{k}[row * {w}u + (col - {st}u)]; }}")
    lines += ["  }", "}"]
    return KernelSource(
        name=name, source="\n".join(lines) + "\n", kind="cat",
        params=("out:ptr", *(f"in{k}:ptr" for k in range(len(shapes)))),
        block=(BLOCK, 1, 1), grid=(_grid1d(n, BLOCK), 1, 1),
    )


# --------------------------------------------------------------------------------------
# reduction

_REDUCE_INIT = {"sum": "0.0f", "max": "__int_as_float(0xff800000)"}  # -inf
_REDUCE_HELPERS = """\
static __device__ __forceinline__ float rs_combine(float a, float b) {{
  return {combine};
}}
static __device__ __forceinline__ float rs_warp_reduce(float v) {{
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = rs_combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}}
"""
_COMBINE = {
    "sum": "__fadd_rn(a, b)",  # never contracted with a prologue's last multiply into an fma
    "max": "(a != a) ? a : ((b > a || b != b) ? b : a)",  # NaN-propagating, like torch.max
}


def _prologue_source(dtype: str, prologue: tuple) -> tuple[str, list[str], list[str], str]:
    """The device function ``rs_value`` of a reduction's pointwise prologue: element i of the
    reduced operand, computed from the inputs' elements i by the instructions (``pointwise_kernel``'s
    language) and rounded to ``dtype`` as a stored operand is, storing element i of each extra
    output ((token, dtype), as ``pointwise_kernel`` does); inputs read through a broadcast as
    ``pointwise_kernel``'s (the operand's shape, per input ``()`` or (input shape, dims)); returns
    (source, the kernel's output parameters after ``out``, its input parameters, the call's
    argument list)."""
    inputs, ops, extra, reads = (*prologue, (), ())[:4]
    ins = [_pointwise_dtype(d) for d in inputs]
    ops = [tuple(o) for o in ops]
    extra = [(tok, _pointwise_dtype(d)) for tok, d in extra]
    body, result, used, fast16, ints = _pointwise_body(ins, dtype, ops, extra)
    if ints[result]:
        raise ReshardError(f"reduce_kernel: the prologue's result {result} is an int; the operand is {dtype}")
    stores = [(_operand(tok, len(ins), len(ops), f"extra output {k + 1}"), d) for k, (tok, d) in enumerate(extra)]
    used |= {int(v[1:]) for v, _ in stores if v[0] == "x"}
    outs = [f"{_POINTWISE_INFO[d][0]}* __restrict__ out{k + 1}" for k, (_, d) in enumerate(stores)]
    params = [f"const {_POINTWISE_INFO[d][0]}* __restrict__ in{k}" for k, d in enumerate(ins)]
    strides = _bcast_strides(len(ins), *reads) if reads else {}
    if reads and _bcast_rolls(reads[1], reads[0]):
        raise ReshardError("reduce_kernel: a prologue reads no input shifted")
    offsets = [f"  {line}" for line in _bcast_offsets("i", reads[0], strides)] if strides else []
    loads = [f"  const {_register(ins[k])} x{k} = "
             + _POINTWISE_INFO[ins[k]][1].format(x=f"in{k}[o{k}]" if k in strides else f"in{k}[i]") + ";"
             for k in sorted(used)]
    src = [gelu16_source(_float_literal)] if fast16 else []
    src += [f"static __device__ __forceinline__ float rs_value({', '.join(params + outs)}, unsigned long long i) {{",
            *offsets, *loads, *(f"  {line}" for line in body),
            *(f"  out{k + 1}[i] = {_stored(v, ints[v], d)};" for k, (v, d) in enumerate(stores)),
            f"  return {_convert(result, False, dtype)};", "}"]
    args = [f"in{k}" for k in range(len(ins))] + [f"out{k + 1}" for k in range(len(stores))]
    return "\n".join(src), outs, params, ", ".join(args)


#: a column reduction (``inner`` > 1) launching fewer blocks than this is split along the reduced dim
SPLIT_BELOW_BLOCKS = 256
#: each part of a split reduction reduces at least this many rows
SPLIT_MIN_ROWS = 64


def reduce_splits(shape: Sequence[int], dim: int) -> int:
    """Into how many parts ``reduce_kernel`` cuts the reduced dim of ``shape`` (1: not cut).

    A column reduction (the tensor viewed as (outer, R, inner), inner > 1) runs one block per
    tile of 32 columns: a norm's or bias's weight gradient, [tokens, hidden] summed over the
    tokens, is ``hidden / 32`` blocks (64 at hidden 2048), each thread reducing ``R / 8``
    elements one after another, too few blocks for a GPU of a hundred SMs (measured: 167 us for
    [4096, 2048] bf16, 16 MiB, where copy bandwidth reads it in 4 us).  Under
    ``SPLIT_BELOW_BLOCKS`` blocks, R is cut into parts of at least ``SPLIT_MIN_ROWS`` rows, enough
    for about ``2 * SPLIT_BELOW_BLOCKS`` blocks; each part's result is a float32 partial
    (``reduce_kernel(..., split=...)``) and the partials are reduced by a second kernel
    (``from_partials``).  Row reductions (inner == 1) are not cut."""
    shp = tuple(shape)
    dm = dim + len(shp) if dim < 0 else dim
    outer, R, inner = _prod(shp[:dm]), shp[dm], _prod(shp[dm + 1:])
    blocks = outer * _ceil_div(inner, 32)
    if inner == 1 or blocks >= SPLIT_BELOW_BLOCKS or R < 2 * SPLIT_MIN_ROWS:
        return 1
    return min(R // SPLIT_MIN_ROWS, _ceil_div(2 * SPLIT_BELOW_BLOCKS, blocks))


def reduce_kernel(shape: Sequence[int], dim: int, op: str, dtype: str, prologue: tuple | None = None,
                  scale: float | None = None, split: int = 1, from_partials: bool = False) -> KernelSource:
    """Reduce one dim of a contiguous tensor: ``out = in.sum(dim)`` or ``in.amax(dim)``.

    The output is contiguous with ``dim`` removed and has the input dtype; accumulation
    is float32.  ``prologue``: (input dtypes, instructions[, extra outputs[, (operand shape,
    broadcast reads)]]): the reduced tensor is not read but computed element by element from
    the inputs (contiguous, of ``shape``'s element count, or read through a broadcast as
    :func:`pointwise_kernel`'s ``shape``/``bcast``), as that kernel computes its result, rounded
    to ``dtype``, and each extra output ((token, dtype), of ``shape``) stored as that kernel
    stores its own (``codegen.fuse``).
    ``scale``: each result, rounded to ``dtype``, is multiplied by it and rounded again (a mean:
    the sum's kernel and a scale kernel's arithmetic, in one kernel).
    The tensor is viewed as (outer, R, inner):

    * inner == 1, R >= 1024: one 256-thread block per output row (warp shuffles, then
      shared memory across the 8 warps);
    * inner == 1, R < 1024: one warp per output row;
    * inner > 1: 32x8 blocks; threadIdx.x walks 32 adjacent outputs (coalesced loads),
      threadIdx.y splits R, partial results combined through shared memory.

    * ``split`` > 1 (inner > 1; ``reduce_splits``): R cut into ``split`` parts of
      ``ceil(R / split)`` rows, one block per (part, tile of 32 columns); ``out`` is the float32
      partials, [outer, split, inner], unrounded and unscaled (the prologue's extra outputs are
      stored as without a split: each element is computed once);
    * ``from_partials``: the input is such float32 partials (of ``shape`` (outer, split, inner),
      ``dim`` 1), reduced and stored as the unsplit kernel stores its result.

    Law: ``reduce_kernel(shape, d, op, t, split=s)`` then ``reduce_kernel((outer, s, inner),
    1, op, t, from_partials=True)`` computes what ``reduce_kernel(shape, d, op, t)`` computes, up
    to the order of the float32 additions (max: exactly).

    Kernel parameters: ``(out, in)``; with a prologue ``(out, out1, ..., out{e}, in0, ..., in{m-1})``
    (one ``outK`` per extra output).
    """
    d = _float_dtype(dtype)
    shp = _check_shape(shape, "reduce_kernel")
    if op not in _COMBINE:
        raise ReshardError(f"reduce_kernel: op {op!r} not in {sorted(_COMBINE)}")
    r = len(shp)
    dm = dim + r if dim < 0 else dim
    if not 0 <= dm < r:
        raise ReshardError(f"reduce_kernel: dim {dim} out of range for shape {shp}")
    outer, R, inner = _prod(shp[:dm]), shp[dm], _prod(shp[dm + 1:])
    if R == 0 and op == "max":
        raise ReshardError(f"reduce_kernel: max over an empty dim {dm} of shape {shp}")
    ct, tof, fromf, _ = _FLOAT_INFO[d]
    init = _REDUCE_INIT[op]
    n_in = outer * R * inner
    it = _idx_type(n_in, outer * inner)
    if split > 1 and (inner == 1 or from_partials or scale is not None):
        raise ReshardError(f"reduce_kernel: split={split} needs columns (inner > 1), no scale and no partials input")
    if from_partials and prologue is not None:
        raise ReshardError("reduce_kernel: partials are read as they are, with no prologue")
    if inner == 1:
        variant = "rows_block" if R >= 1024 else "rows_warp"
    else:
        variant = "cols_split" if split > 1 else "cols"
    spec = {"outer": outer, "R": R, "inner": inner, "op": op, "dtype": d, "v": variant}
    if split > 1:
        spec["split"] = split
    if from_partials:
        spec["from_partials"] = True
        helper, params, load = "", ["const float* __restrict__ in"], "in[{i}]"
    elif prologue is None:
        helper, params, load = "", [f"const {ct}* __restrict__ in"], tof.format(x="in[{i}]")
    else:
        reads = (*prologue, (), ())[3]
        spec["prologue"] = [[_pointwise_dtype(x) for x in prologue[0]], [list(o) for o in prologue[1]],
                            [[tok, _pointwise_dtype(x)] for tok, x in (*prologue, ())[2]],
                            [list(reads[0]), [[list(b[0]), list(b[1])] if b else [] for b in reads[1]]] if reads else []]
        helper, outs, ins, args = _prologue_source(d, prologue)
        params = outs + ins
        load = f"rs_value({args}, {{i}})"
    if scale is not None:
        spec["scale"] = _float_literal(scale)
        stored = fromf.format(x=f"__fmul_rn({tof.format(x=fromf.format(x='acc'))}, {spec['scale']})")
    else:
        stored = fromf.format(x="acc")
    name = f"rs_reduce_{_spec_hash('reduce', spec)}"
    dtypes = [d, *(spec["prologue"][0] if prologue else ()), *(x for _, x in (spec["prologue"][2] if prologue else ())),
              *(normalize_dtype(o[2]) for o in (prologue[1] if prologue else ()) if o[0] == "cast")]
    head = [
        f"// generated by reshard.codegen.kernels.reduce_kernel: {op} over dim {dm} of {shp} ({variant})",
        _headers(dtypes),
        _REDUCE_HELPERS.format(combine=_COMBINE[op]),
        helper,
        f'extern "C" __global__ void __launch_bounds__(256) {name}({"float" if split > 1 else ct}* __restrict__ out, '
        f'{", ".join(params)}) {{',
    ]
    if variant == "rows_block":
        body = [
            "  __shared__ float warp_acc[8];",
            "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
            f"  for ({it} row = blockIdx.x; row < {outer}u; row += gridDim.x) {{",
            f"    const {it} base = ({it})row * {R}u;",
            f"    float acc = {init};",
            "    #pragma unroll 4",  # (independent loads in flight; the additions stay in order)
            f"    for ({it} j = threadIdx.x; j < {R}u; j += 256u) acc = rs_combine(acc, {load.format(i='base + j')});",
            "    acc = rs_warp_reduce(acc);",
            "    if (lane == 0) warp_acc[warp] = acc;",
            "    __syncthreads();",
            "    if (warp == 0) {",
            f"      acc = lane < 8 ? warp_acc[lane] : {init};",
            "      acc = rs_warp_reduce(acc);",
            f"      if (lane == 0) out[row] = {stored};",
            "    }",
            "    __syncthreads();",
            "  }",
        ]
        block, grid = (256, 1, 1), (max(1, min(outer, MAX_GRID)), 1, 1)
    elif variant == "rows_warp":
        body = [
            "  const int lane = threadIdx.x & 31;",
            f"  for ({it} row = blockIdx.x * 8u + (threadIdx.x >> 5); row < {outer}u; row += gridDim.x * 8u) {{",
            f"    const {it} base = ({it})row * {R}u;",
            f"    float acc = {init};",
            "    #pragma unroll 4",  # (independent loads in flight; the additions stay in order)
            f"    for ({it} j = lane; j < {R}u; j += 32u) acc = rs_combine(acc, {load.format(i='base + j')});",
            "    acc = rs_warp_reduce(acc);",
            f"    if (lane == 0) out[row] = {stored};",
            "  }",
        ]
        block, grid = (256, 1, 1), (max(1, min(_ceil_div(outer, 8), MAX_GRID)), 1, 1)
    else:  # columns: a block per (part of R, tile of 32 columns); unsplit, one part
        tiles_j, rows = _ceil_div(inner, 32), _ceil_div(R, split)
        total = outer * split * tiles_j
        if split > 1:
            where = [f"    const {it} o = t / {split * tiles_j}u, s = t / {tiles_j}u % {split}u;",
                     f"    const {it} j = (t % {tiles_j}u) * 32u + threadIdx.x;",
                     f"    const {it} r1 = min(({it})(s * {rows}u + {rows}u), ({it}){R}u);"]
            first, end, dst, value = f"s * {rows}u + threadIdx.y", "r1", f"(o * {split}u + s) * {inner}u + j", "acc"
        else:
            where = [f"    const {it} o = t / {tiles_j}u;", f"    const {it} j = (t % {tiles_j}u) * 32u + threadIdx.x;"]
            first, end, dst, value = "threadIdx.y", f"{R}u", f"o * {inner}u + j", stored
        body = [
            "  __shared__ float part[8][33];",
            f"  for ({it} t = blockIdx.x; t < {total}u; t += gridDim.x) {{",
            *where,
            f"    float acc = {init};",
            f"    if (j < {inner}u) {{",
            f"      const {it} base = o * {R * inner}u + j;",
            "      #pragma unroll 4",
            f"      for ({it} r = {first}; r < {end}; r += 8u) "
            f"acc = rs_combine(acc, {load.format(i=f'base + r * {inner}u')});",
            "    }",
            "    part[threadIdx.y][threadIdx.x] = acc;",
            "    __syncthreads();",
            f"    if (threadIdx.y == 0 && j < {inner}u) {{",
            "      #pragma unroll",
            "      for (int y = 1; y < 8; ++y) acc = rs_combine(acc, part[y][threadIdx.x]);",
            f"      out[{dst}] = {value};",
            "    }",
            "    __syncthreads();",
            "  }",
        ]
        block, grid = (32, 8, 1), (max(1, min(total, MAX_GRID)), 1, 1)
    src = "\n".join(head + body + ["}"]) + "\n"
    ins = ("in:ptr",) if prologue is None else (*(f"out{k + 1}:ptr" for k in range(len(spec["prologue"][2]))),
                                                *(f"in{k}:ptr" for k in range(len(prologue[0]))))
    return KernelSource(name=name, source=src, kind=f"reduce_{variant}", params=("out:ptr", *ins),
                        block=block, grid=grid)

