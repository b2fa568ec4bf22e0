"""Names of derived values: a value's gradient and its saved copy are named after it.

Law: ``grad_name(n)`` is the name of the gradient of the value (or input) named ``n``
(``passes.autodiff.joint``: a training program's outputs after the loss), ``saved_name(n)``
the name of the forward buffer of ``n`` the backward pass reads (``saved`` ops); ``base_name``
drops every such prefix, so ``base_name(grad_name(saved_name(n))) == n``.
"""

from __future__ import annotations

GRAD, SAVED = "grad.", "saved."
#: prefixes of names derived from another value's
DERIVED = (GRAD, SAVED)


def grad_name(name: str) -> str:
    """The name of the gradient of the value named ``name``."""
    return GRAD + name


def saved_name(name: str) -> str:
    """The name of the saved (forward) copy of the value named ``name``."""
    return SAVED + name


def base_name(name: str) -> str:
    """``name`` without its derived prefixes (``grad.saved.x`` -> ``x``)."""
    while name.startswith(DERIVED):
        name = name.split(".", 1)[1]
    return name
