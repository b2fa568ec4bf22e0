"""Row-major strides: the one home of the law every flat buffer of reshard is laid out by."""

from __future__ import annotations

from collections.abc import Sequence


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a contiguous row-major tensor of ``shape``: dim ``d``'s is the product
    of the extents after it (the last dim's 1), so element ``c`` sits at ``sum(c[d] * strides[d])``."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))
