"""Files as the harness reads, hashes and shows them.

``read_regular`` refuses what could block or never end (FIFOs, devices, folders);
``sha256_file`` hashes in chunks; ``shown`` writes paths as committed evidence shows them
(this repository's relative, the home folder as ``~``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from xla_harness.errors import HarnessError

REPO = Path(__file__).resolve().parents[2]


def shown(text: str) -> str:
    """``text`` with this repository's absolute path made relative and the home folder written ``~``."""
    text = text.replace(f"{REPO}/", "").replace(str(REPO), ".")
    home = str(Path.home())
    return text.replace(home + "/", "~/") if home not in ("/", "") else text


# Larger than any HLO dump, buffer assignment, log or result file the harness reads; a file past
# it is refused rather than read whole into memory.
MAX_READ_BYTES = 1 << 30


def read_regular(path: Path, max_bytes: int = MAX_READ_BYTES) -> bytes:
    """The bytes of a regular file; FIFOs, devices and folders are refused (they could block or never
    end), and so is a file of more than ``max_bytes`` bytes (also when it grows while being read)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise HarnessError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HarnessError(f"{path} is not a regular file")
        too_big = HarnessError(f"{path}: more than {max_bytes} bytes; refusing to read it")
        if st.st_size > max_bytes:
            raise too_big
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise too_big
        return data
    except OSError as exc:
        raise HarnessError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
