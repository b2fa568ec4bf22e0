"""Rewrite rules as data: each rule is an egglog command plus the law it implements.

Names: the e-graph reports a rule by ``Rule.reported_name``: its ``name``, which is the
literal string passed to ``Rule(...)`` in the source (grep for it), followed, for a rule
generated once per mesh axis, layout or team size, by ``-<variant>`` (``Rule.variant``:
the axis ``0``, a view ``lhs``, a collective kind and team size ``allgather-n2``, ...).
So ``allgather-1`` is the rule ``Rule("allgather", ..., variant="1")`` and
``cost-collective-all_to_all-from-outermost-dim-0`` is ``Rule("cost-collective", ...)``.
``reshard rules [--family F]`` prints every rule with its law, grouped by family (the
module that states it, ``encode.rule_families``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One egglog rule.  ``law`` states what it asserts about values; ``query``/``actions``
    are egglog s-expressions; ``ruleset`` is the saturation phase it belongs to;
    ``variant`` tells the instances of a generated rule apart (module docstring)."""

    name: str
    law: str
    query: str
    actions: str
    ruleset: str
    variant: str = ""

    @property
    def reported_name(self) -> str:
        """The name the e-graph reports: ``name``, or ``name-variant``."""
        return f"{self.name}-{self.variant}" if self.variant else self.name

    def render(self) -> str:
        return f'(rule ({self.query}) ({self.actions}) :ruleset {self.ruleset} :name "{self.reported_name}")'


def render_all(rules: list[Rule]) -> str:
    return "\n".join(r.render() for r in rules)
