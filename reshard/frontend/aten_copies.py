"""ATen ops that copy or cast: ``_to_copy`` / ``to`` / ``type_as`` (cast; the identity when
the dtype is unchanged), ``clone`` / ``contiguous`` / ``alias`` (identity), ``detach`` (the
identity; ``f.detach`` when converting for training), ``dropout`` (identity in eval or with p = 0), and the asserts export records (no-ops)."""

from __future__ import annotations

from typing import Any

from ..ir.fusion import Tensor
from .converter import Converter, first, op


@op("_to_copy", "to", "type_as", "_to_dtype")
def _to(cv: Converter, n: Any, a: dict) -> Tensor:
    return cv.cast(cv.tensor(first(a), "input"), cv.out_dtype())


@op("clone", "contiguous", "alias", "lift_fresh_copy", "identity")
def _identity(cv: Converter, n: Any, a: dict) -> Tensor:
    return cv.tensor(first(a), "input")


@op("detach")
def _detach(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(first(a), "input")
    return cv.f.detach(x) if cv.train else x


@op("dropout", "feature_dropout")
def _dropout(cv: Converter, n: Any, a: dict) -> Tensor:
    if a.get("train") and a.get("p", 0) != 0:
        fix = ("a plan has no random ops: set its probability to 0 (a Hugging Face config's *_pdrop / "
               "*_dropout = 0.0)" if cv.train else "call module.eval() before from_torch")
        raise cv.fail(f"{n.target} in training mode (p={a['p']}); {fix}")
    return cv.tensor(a["input"], "input")


@op("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size")
def _noop(cv: Converter, n: Any, a: dict) -> None:
    return None

