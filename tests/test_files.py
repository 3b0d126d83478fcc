from pathlib import Path

from xla_harness.files import REPO, shown


def test_committed_evidence_names_no_path_of_this_machine():
    home = Path.home()
    text = f"g++ -I{home}/.cache/x/include {REPO}/harness/a.cc -o {REPO}"
    assert shown(text) == "g++ -I~/.cache/x/include harness/a.cc -o ."
    assert shown("/opt/other/file") == "/opt/other/file"


def test_read_regular_refuses_what_could_block_and_sha256_file_hashes_the_bytes(tmp_path):
    import hashlib
    import os

    import pytest

    from xla_harness.errors import HarnessError
    from xla_harness.files import read_regular, sha256_file

    f = tmp_path / "f"
    data = os.urandom(3 * (1 << 20) + 7)  # more than one chunk
    f.write_bytes(data)
    assert read_regular(f) == data
    assert sha256_file(f) == hashlib.sha256(data).hexdigest()
    os.mkfifo(tmp_path / "fifo")
    for bad in (tmp_path / "fifo", tmp_path):
        with pytest.raises(HarnessError, match="is not a regular file"):
            read_regular(bad)
