"""IterDomain algebra: the extent analysis and the split/merge laws.

Every law is an identity between index functions (``reshard.ir.ids``), guarded by the
divisibility that makes both sides defined.  ``e(x)`` is ``ext(x)``.  Two IDs in one
e-class denote the same index function, so "is this reshape local?" becomes "are the IDs
bound to each mesh axis in the same e-class?".

Termination around extent 1.  An index of extent 1 (a size-1 dim, ``Inner(x,
e(x))`` of a dim split into its own extent, ``Outer(x, 1)``) is 0 everywhere, so
``Merge(x, u) = Merge(u, x) = x`` and every class holding a merge with a unit is cyclic
(``x = Merge(x, u)``).  Without the unit laws, merge-assoc rewrote
``Merge(Merge(x, u), u)`` into ``Merge(x, Merge(u, u))``, a new class, and so on without
end; with them every merge of units collapses into the unit, and merge-assoc is left to
indices of extents other than 1.  Transport decomposes only indices with an extent: a
reduced dim's image ``Red`` has none, and one class holds the reduced dims of every op, so
transporting the terms of that class (and the mixed terms ``Merge(x, Red)`` a reduction
leaves behind) through later ops built new ``Tr`` terms forever; such terms are never
bound to a mesh axis (``placements``: a placement needs an extent), so nothing is lost.
"""

from __future__ import annotations

from .rule import Rule

R = "ids"

RULES: list[Rule] = [
    # ---- extent analysis ----------------------------------------------------------
    Rule("ext-root", "e(Root(s, d, n)) = n", "(= x (Root s d n))", "(set (ext x) n)", R),
    Rule("ext-outer", "e(Outer(x, p)) = p  when p | e(x)",
         "(= y (Outer x p)) (= e (ext x)) (> p 0) (= 0 (% e p))", "(set (ext y) p)", R),
    Rule("ext-inner", "e(Inner(x, p)) = e(x) / p  when p | e(x)",
         "(= y (Inner x p)) (= e (ext x)) (> p 0) (= 0 (% e p))", "(set (ext y) (/ e p))", R),
    Rule("ext-merge", "e(Merge(x, y)) = e(x) * e(y)",
         "(= z (Merge x y)) (= ex (ext x)) (= ey (ext y))", "(set (ext z) (* ex ey))", R),
    # ---- split / merge laws -------------------------------------------------------
    Rule("outer-whole", "Outer(x, e(x)) = x", "(= y (Outer x p)) (= p (ext x))", "(union y x)", R),
    Rule("inner-one", "Inner(x, 1) = x", "(= y (Inner x 1)) (= e (ext x))", "(union y x)", R),
    Rule("merge-split", "Merge(Outer(x, p), Inner(x, p)) = x  when p | e(x)",
         "(= m (Merge (Outer x p) (Inner x p))) (= e (ext x)) (= 0 (% e p))", "(union m x)", R),
    Rule("outer-merge-exact", "Outer(Merge(x, y), e(x)) = x",
         "(= z (Outer (Merge x y) p)) (= p (ext x)) (= ey (ext y))", "(union z x)", R),
    Rule("outer-merge-within", "Outer(Merge(x, y), p) = Outer(x, p)  when p | e(x), p < e(x)",
         "(= z (Outer (Merge x y) p)) (= ex (ext x)) (= ey (ext y)) (< p ex) (= 0 (% ex p))",
         "(union z (Outer x p))", R),
    Rule("outer-merge-across", "Outer(Merge(x, y), p) = Merge(x, Outer(y, p / e(x)))  when e(x) | p, (p/e(x)) | e(y)",
         "(= z (Outer (Merge x y) p)) (= ex (ext x)) (= ey (ext y)) (> p ex) (= 0 (% p ex)) (= 0 (% ey (/ p ex)))",
         "(union z (Merge x (Outer y (/ p ex))))", R),
    Rule("inner-merge-exact", "Inner(Merge(x, y), e(x)) = y",
         "(= z (Inner (Merge x y) p)) (= p (ext x)) (= ey (ext y))", "(union z y)", R),
    Rule("inner-merge-within", "Inner(Merge(x, y), p) = Merge(Inner(x, p), y)  when p | e(x), p < e(x)",
         "(= z (Inner (Merge x y) p)) (= ex (ext x)) (= ey (ext y)) (< p ex) (= 0 (% ex p))",
         "(union z (Merge (Inner x p) y))", R),
    Rule("inner-merge-across", "Inner(Merge(x, y), p) = Inner(y, p / e(x))  when e(x) | p, (p/e(x)) | e(y)",
         "(= z (Inner (Merge x y) p)) (= ex (ext x)) (= ey (ext y)) (> p ex) (= 0 (% p ex)) (= 0 (% ey (/ p ex)))",
         "(union z (Inner y (/ p ex)))", R),
    Rule("outer-outer", "Outer(Outer(x, p), q) = Outer(x, q)  when q | p | e(x)",
         "(= z (Outer (Outer x p) q)) (= e (ext x)) (= 0 (% e p)) (= 0 (% p q))", "(union z (Outer x q))", R),
    Rule("inner-inner", "Inner(Inner(x, p), q) = Inner(x, p * q)  when p * q | e(x)",
         "(= z (Inner (Inner x p) q)) (= e (ext x)) (= 0 (% e (* p q)))", "(union z (Inner x (* p q)))", R),
    Rule("outer-inner", "Outer(Inner(x, p), q) = Inner(Outer(x, p * q), p)  when p * q | e(x) (both are "
         "(x mod e/p) div e/(pq) = (x div e/(pq)) mod q: a block split of a cyclic split is a cyclic split of a "
         "finer block split)",
         "(= z (Outer (Inner x p) q)) (= e (ext x)) (> p 0) (> q 0) (= 0 (% e (* p q)))",
         "(union z (Inner (Outer x (* p q)) p))", R),
    Rule("merge-unit-right", "Merge(x, u) = x  when e(u) = 1 (u is 0 everywhere: x*1 + 0)",
         "(= z (Merge x u)) (= 1 (ext u)) (= ex (ext x))", "(union z x)", R),
    Rule("merge-unit-left", "Merge(u, y) = y  when e(u) = 1 (u is 0 everywhere: 0*e(y) + y)",
         "(= z (Merge u y)) (= 1 (ext u)) (= ey (ext y))", "(union z y)", R),
    Rule("merge-assoc", "Merge(Merge(x, y), z) = Merge(x, Merge(y, z))  when x, y, z have extents other than 1 "
         "(units: the unit laws; see the module docstring)",
         "(= m (Merge (Merge x y) z)) (= ex (ext x)) (= ey (ext y)) (= ez (ext z)) (!= ex 1) (!= ey 1) (!= ez 1)",
         "(union m (Merge x (Merge y z)))", R),
    # ---- transport through an op's index map --------------------------------------
    Rule("tr-outer", "Tr(Outer(x, p), c) = Outer(Tr(x, c), p)  for an index x (with an extent)",
         "(= z (Tr (Outer x p) c)) (= e (ext x))", "(union z (Outer (Tr x c) p))", R),
    Rule("tr-inner", "Tr(Inner(x, p), c) = Inner(Tr(x, c), p)  for an index x (with an extent)",
         "(= z (Tr (Inner x p) c)) (= e (ext x))", "(union z (Inner (Tr x c) p))", R),
    Rule("tr-merge", "Tr(Merge(x, y), c) = Merge(Tr(x, c), Tr(y, c))  for indices x, y (with extents)",
         "(= z (Tr (Merge x y) c)) (= ex (ext x)) (= ey (ext y))", "(union z (Merge (Tr x c) (Tr y c)))", R),
    # ---- rectangular indices: a mesh axis bound to one selects a product of per-dim sets ----
    Rule("root-of-root", "Root(s, d, n) reads dim d", "(= x (Root s d n))", "(set (rootof x) d)", R),
    Rule("root-of-outer", "Outer(x, p) reads x's one dim", "(= y (Outer x p)) (= r (rootof x)) (= e (ext y))",
         "(set (rootof y) r)", R),
    Rule("root-of-inner", "Inner(x, p) reads x's one dim", "(= y (Inner x p)) (= r (rootof x)) (= e (ext y))",
         "(set (rootof y) r)", R),
    Rule("rect-single", "an index of one dim selects, per value, a set of that dim's positions",
         "(= r (rootof x))", "(rect x)", R),
    Rule("rect-merge", "Merge of indices of two different dims selects a product of their sets",
         "(= z (Merge x y)) (= rx (rootof x)) (= ry (rootof y)) (!= rx ry)", "(rect z)", R),
    # ---- reduced indices ------------------------------------------------------------
    Rule("red-base", "Red is reduced", "(= x (Red))", "(red x)", R),
    Rule("red-outer", "Outer(x, p) is reduced if x is", "(= y (Outer x p)) (red x)", "(red y)", R),
    Rule("red-inner", "Inner(x, p) is reduced if x is", "(= y (Inner x p)) (red x)", "(red y)", R),
    Rule("red-merge", "Merge(x, y) is reduced if x and y are", "(= z (Merge x y)) (red x) (red y)", "(red z)", R),
]
