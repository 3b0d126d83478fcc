"""Ctrl-C while a large gzip-compressed dump is read acts at once: the file is decompressed a few MiB
at a time, so the signal's handler runs between two pieces, not after the whole file is out."""

from __future__ import annotations

import gzip
import signal

import pytest

from xla_harness.hlo.memplan.inputs import GUNZIP_CHUNK, gunzip


def test_a_signal_acts_between_two_pieces_of_a_large_dump(tmp_path):
    total = 64 * GUNZIP_CHUNK  # 256 MiB of text: about 0.3 s to decompress, 3x the alarm
    data = gzip.compress(b"%x = f32[8]{0} add(%a, %b)\n" * (total // 27), compresslevel=1)
    seen: list[int] = []

    def handler(signum, frame):
        while frame is not None and frame.f_code.co_name != "gunzip":
            frame = frame.f_back
        seen.append(sum(map(len, frame.f_locals.get("parts", []))) if frame is not None else -1)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            gunzip(data, tmp_path / "m.txt.gz")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # it acted inside the read, some pieces out and others still compressed
    assert len(seen) == 1 and 0 < seen[0] < total - GUNZIP_CHUNK, (seen, total)


def test_a_broken_or_concatenated_gzip_file(tmp_path):
    from xla_harness.errors import HarnessError

    assert gunzip(gzip.compress(b"a\n") + gzip.compress(b"b\n"), tmp_path / "m.gz") == b"a\nb\n"
    with pytest.raises(HarnessError, match="a broken gzip file"):
        gunzip(gzip.compress(b"x" * 100)[:-9], tmp_path / "m.gz")
