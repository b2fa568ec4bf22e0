"""Rewrite rules as data: each rule is an egglog command plus the law it implements."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One egglog rule.  ``law`` states what it asserts about values; ``query``/``actions``
    are egglog s-expressions; ``ruleset`` is the saturation phase it belongs to."""

    name: str
    law: str
    query: str
    actions: str
    ruleset: str

    def render(self) -> str:
        return f'(rule ({self.query}) ({self.actions}) :ruleset {self.ruleset} :name "{self.name}")'


def render_all(rules: list[Rule]) -> str:
    return "\n".join(r.render() for r in rules)
