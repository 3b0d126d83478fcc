"""Differential gradient checks for the bug classes of DESIGN.md: where-guarded
singularities (zero cotangent x infinite derivative), select/where JVPs with partly traced
operands, reverse mode through loops whose body Jacobian depends on the variable, and
determinism. Cases live in ``cases.py``; ``check.py`` runs them in several modes and
compares with an analytic answer, central finite differences in float64 and the J^T
consistency <u, J v> == <J^T u, v>."""
