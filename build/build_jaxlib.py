"""Build jaxlib from source with the patch series: the entry point `make build-and-test` calls.

The logic lives in xla_harness/upstream/jaxlib_build.py; run with --help for the stages and flags.
Any error the build logic does not map itself is one ``error:`` line and exit 2 (``--debug``
adds the traceback).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xla_harness.cli import guarded  # noqa: E402
from xla_harness.upstream.jaxlib_build import main  # noqa: E402


def entry(argv: list[str] | None = None) -> int:
    return guarded(main, argv, strip_debug=True)


if __name__ == "__main__":
    sys.exit(entry())
