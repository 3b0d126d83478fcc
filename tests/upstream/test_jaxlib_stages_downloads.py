"""The jaxlib build's download is capped: an endless source (file:///dev/zero) stops at the cap."""

import io

import pytest

from xla_harness.errors import HarnessError
from xla_harness.upstream import jaxlib_stages


def test_copy_capped_stops_past_the_cap():
    out = io.BytesIO()
    with pytest.raises(HarnessError, match="larger than 10 bytes"):
        jaxlib_stages.copy_capped(io.BytesIO(b"x" * 11), out, 10, "u", chunk=4)
    assert len(out.getvalue()) <= 10
    out = io.BytesIO()
    assert jaxlib_stages.copy_capped(io.BytesIO(b"x" * 10), out, 10, "u", chunk=4) == 10


def test_dev_zero_is_cut_off_and_the_partial_file_removed(tmp_path):
    dest = tmp_path / "xla.partial"
    with pytest.raises(HarnessError, match="file:///dev/zero is larger than 1048576 bytes"):
        jaxlib_stages._download("file:///dev/zero", dest, max_bytes=1 << 20)
    assert not dest.exists()
