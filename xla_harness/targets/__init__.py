"""Compile targets: where a program's step is compiled, with or without the hardware.

``host`` compiles on this machine's backend (today's behaviour). ``tpu:GEN:SHAPE`` compiles ahead
of time with libtpu for a TPU topology (``tpu:v6e:2x4``: eight v6e chips) and ``cuda:KIND[:TOPO]``
with the CUDA PJRT plugin for NVIDIA GPUs (``cuda:h100``, eight H100s on one host), both on a
machine with neither: the program's state is described as ``jax.ShapeDtypeStruct``s with
shardings on the target's devices and ``jax.jit(step).lower(...).compile()`` runs the real
compiler. Nothing is executed.

* :mod:`~xla_harness.targets.spec`: ``--target`` text -> :class:`Target` (pure);
* :mod:`~xla_harness.targets.gpu`: the device description of each GPU kind (pure);
* :mod:`~xla_harness.targets.devices`: the target's devices, its compiler's version, the
  environment it needs;
* :mod:`~xla_harness.targets.compile`: a :class:`~xla_harness.programs.interface.TrainProgram`'s
  step compiled for a target, with its HLO and buffer assignment.
"""

from xla_harness.targets.spec import HOST, Target, parse_target

__all__ = ["HOST", "Target", "parse_target"]
