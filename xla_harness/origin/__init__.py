"""Whose NaN is it: the origin of a failing step (input, race, program, precision, compiler, unknown).

:func:`~xla_harness.origin.classify.origin_of` decides it from the state before the step, its batch
and a replay of the compiled step; :mod:`~xla_harness.origin.eager` evaluates the step's jaxpr one
equation at a time and names the equation (and the user's file:line) where a non-finite value was
born; :mod:`~xla_harness.origin.source` finds that file:line and :mod:`~xla_harness.origin.known`
the known bug class it is an instance of. ``stress --explain``, ``triage`` and the pytest plugin call
it through :mod:`xla_harness.stress.explain`.
"""
