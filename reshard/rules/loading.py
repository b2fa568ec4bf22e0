"""Loading rules: flat rows of facts, read in bulk (``search.load``), made the terms and
unions they state.  Ruleset ``load``, run twice right after a segment's facts are loaded,
before any other rule; the rows' tables (``schema.LOAD_ONLY``) are not counted as e-graph size.

* ``index-map``: an op's index map ``rootmap(s, d, n, c, t, d2, n2)`` is the union
  ``Tr(Root(s, d, n), c) = Root(t, d2, n2)`` (``encode.op_facts``).
* ``seam-placement`` (first run) and ``seam-fed`` (second): a value ``v`` fed to a segment at a
  dist of its producer's class ``key`` (``segments``: ``(union (real v D) (Seam key))``),
  stated as ``seamv(v, key)`` and one row per mesh axis a (``encode.seam_facts``): ``seamrep``
  (Rep), ``seampart`` (Part o), ``seamroot`` (Bind(Root(v, j, e))), ``seamouter``
  (Bind(Outer(Root(v, j, e), n))); ``seamp(key, a)`` is axis a's placement term.
"""

from __future__ import annotations

from .rule import Rule

L = "load"


def rules(m: int) -> list[Rule]:
    """The loading rules of an ``m``-axis mesh."""
    places = " ".join(f"(= p{a} (seamp k {a}))" for a in range(m))
    dist = "(D " + " ".join(f"p{a}" for a in range(m)) + ")"
    return [
        Rule("index-map", "an index-map row states Tr(Root(s, d, n), c) = Root(t, d2, n2)",
             "(rootmap s d n c t d2 n2)", "(union (Tr (Root s d n) c) (Root t d2 n2))", L),
        Rule("seam-placement", "a seamrep row: fed class k holds Rep on axis a", "(seamrep k a)",
             "(set (seamp k a) (Rep))", L, variant="rep"),
        Rule("seam-placement", "a seampart row: fed class k holds Part(o) on axis a", "(seampart k a o)",
             "(set (seamp k a) (Part o))", L, variant="part"),
        Rule("seam-placement", "a seamroot row: fed class k holds dim j of v (extent e) whole on axis a",
             "(seamroot k a v j e)", "(set (seamp k a) (Bind (Root v j e)))", L, variant="root"),
        Rule("seam-placement", "a seamouter row: fed class k holds dim j of v (extent e) split n ways on axis a",
             "(seamouter k a v j e n)", "(set (seamp k a) (Bind (Outer (Root v j e) n)))", L, variant="outer"),
        Rule("seam-fed", "value v fed at the dist of its placements per axis is the producer's class k",
             f"(seamv v k) {places}", f"(union (real v {dist}) (Seam k))", L),
    ]
