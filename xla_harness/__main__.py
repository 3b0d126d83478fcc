"""``python -m xla_harness ...``: the ``xla-harness`` command, for machines where only the source
is at hand (``PYTHONPATH=<checkout> python -m xla_harness stress ...``)."""

from xla_harness.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
