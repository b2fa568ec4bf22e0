"""Shared by the GPU check scripts: the float64 reference and output tolerances."""

from __future__ import annotations

import copy
import dataclasses

import reshard as rs

#: largest relative error (norm) accepted per least precise dtype of a Fusion
OUT_TOL = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 5e-3, "float64": 1e-5}


def as_float64(f: rs.Fusion) -> rs.Fusion:
    """The same Fusion with every tensor in float64 (the reference in higher precision)."""
    g = copy.copy(f)
    g.tensors = [dataclasses.replace(t, dtype="float64") for t in f.tensors]
    return g


def low_dtype(f: rs.Fusion) -> str:
    """The least precise dtype the Fusion computes in (sets the output tolerance)."""
    return max((t.dtype for t in f.tensors), key=lambda d: OUT_TOL[d])
