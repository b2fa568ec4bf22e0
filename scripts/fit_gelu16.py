#!/usr/bin/env python3
"""Reproduce ``reshard.codegen.fast_math``'s gelu16 constants.

``Phi(-t) = s P(s) exp(-t^2 / 2)`` with ``s = 1 / (1 + c t)``: for each ``c`` on a grid,
fit ``P`` (degree ``--degree``) to ``Phi(-t) exp(t^2/2) / s`` on Chebyshev nodes in ``s``
covering ``t`` in [0, ``--tmax``], minimizing the largest relative error by Lawson's
iteration (iteratively reweighted least squares); print the best ``c``, its error and ``P``.

Usage: python scripts/fit_gelu16.py [--degree 6] [--tmax 14]
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.special import erfcx


def fit(c: float, degree: int, tmax: float, nodes: int = 3000, rounds: int = 200) -> tuple[np.ndarray, float]:
    """Coefficients (lowest degree first) and largest relative error for one ``c``."""
    smin = 1.0 / (1.0 + c * tmax)
    k = np.arange(nodes)
    s = smin + (1 - smin) * (0.5 + 0.5 * np.cos(np.pi * (k + 0.5) / nodes))
    t = (1 / s - 1) / c
    target = 0.5 * erfcx(t / np.sqrt(2)) * (1 + c * t)  # Phi(-t) exp(t^2/2) / s
    basis = np.vander(s, degree + 1, increasing=True) / target[:, None]
    w = np.ones(nodes)
    for _ in range(rounds):
        coef, *_ = np.linalg.lstsq(basis * np.sqrt(w)[:, None], np.sqrt(w), rcond=None)
        err = np.abs(basis @ coef - 1)
        w = w * err / (w * err).sum()
    return coef, float(err.max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--degree", type=int, default=6)
    ap.add_argument("--tmax", type=float, default=14.0)
    args = ap.parse_args()
    best = min(((c, *fit(c, args.degree, args.tmax)) for c in np.round(np.linspace(0.1, 0.6, 101), 3)),
               key=lambda r: r[2])
    c, coef, err = best
    print(f"GELU16_SCALE = {c}")
    print(f"max relative error {err:.3g}")
    print("GELU16_POLY = (" + ", ".join(repr(float(x)) for x in coef) + ")")


if __name__ == "__main__":
    main()
