"""Differential gradient checks for four bug classes of autodiff under XLA: singularities
guarded by ``where`` (a zero cotangent times an infinite derivative gives NaN, not 0),
select/where JVPs with partly traced operands, reverse mode through loops whose body Jacobian
depends on the variable, and determinism. Cases live in ``cases.py``; ``check.py`` runs them in
several modes and compares with an analytic answer, central finite differences in float64 and
the J^T consistency <u, J v> == <J^T u, v>; ``cross.py`` runs the same cases under TF and MLX
(``frameworks/``)."""
