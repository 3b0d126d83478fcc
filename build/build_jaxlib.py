"""Build jaxlib from source with the patch series: the entry point `make build-and-test` calls.

The logic lives in harness/upstream/jaxlib_build.py; run with --help for the stages and flags.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.upstream.jaxlib_build import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
