"""Conditions on indices in a node (`where(j ≤ i + #J − #I, ...)`, `[j < LEN[b]]`), and which of them a
contraction's epilogue computes.

A contraction kernel knows each stored element's coordinates (its tile's rows and columns, its batch):
a condition over the node's own index variables, with sizes and constants, is a comparison of those
coordinates (habu/lower/contraction.py renames its variables to the kernel's axes, `condition_axis`; the
finite-field check and the printed C evaluate it there). A condition that reads an index tensor
(`LEN[b]`, a padded batch's lengths) or a variable the node does not write stays with the general family.

A row kernel knows each element's row coordinates and its column: a row reduction's conditions over those (any
variable that is not a row axis is the column, as its loads read it) are computed there too (`row_conditions`,
habu/lower/rows.py `conditions_on_columns`: attention's masked row sum `Σ j where(j ≤ i + #J − #I, exp(S − M), 0)`).
A condition that reads an index tensor stays with the general family."""

from __future__ import annotations

from habu.spec.ir import Compare, Equation, IndexVar, walk


def has_condition(eq: Equation) -> bool:
    """Whether the node holds a condition on indices (`where(j ≤ i, ...)`, `[j < LEN[b]]`)."""
    return any(isinstance(x, Compare) for x in walk(eq.rhs))


def epilogue_conditions(eq: Equation) -> bool:
    """Whether every condition of the node compares only its own index variables (and sizes, constants):
    what a contraction's epilogue computes at each stored element."""
    own = set(eq.lhs)
    return all(isinstance(ix, IndexVar) and ix in own
               for x in walk(eq.rhs) if isinstance(x, Compare) for ix in x.index_exprs())


def row_conditions(eq: Equation) -> bool:
    """Whether a row kernel computes every condition of the node: none reads an index tensor."""
    return all(isinstance(ix, IndexVar) for x in walk(eq.rhs) if isinstance(x, Compare) for ix in x.index_exprs())


__all__ = ["epilogue_conditions", "has_condition", "row_conditions"]
