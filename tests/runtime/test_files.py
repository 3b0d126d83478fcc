from pathlib import Path

from xla_harness.runtime.files import REPO, shown


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
    from xla_harness.runtime.files import read_regular, sha256_file

    f = tmp_path / "f"
    data = os.urandom(3 * (1 << 20) + 7)  # more than one chunk
    f.write_bytes(data)
    assert read_regular(f) == data
    assert sha256_file(f) == hashlib.sha256(data).hexdigest()
    os.mkfifo(tmp_path / "fifo")
    for bad in (tmp_path / "fifo", tmp_path):
        with pytest.raises(HarnessError, match="is not a regular file"):
            read_regular(bad)


def test_read_regular_refuses_a_file_past_its_size_cap(tmp_path):
    import pytest

    from xla_harness.errors import HarnessError
    from xla_harness.runtime.files import MAX_READ_BYTES, read_regular

    assert MAX_READ_BYTES == 1 << 30
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    assert read_regular(f, max_bytes=100) == b"x" * 100
    with pytest.raises(HarnessError, match=r"more than 99 bytes; refusing"):
        read_regular(f, max_bytes=99)


def test_scan_of_a_dump_with_a_fifo_buffer_assignment_gives_one_error_line_and_does_not_hang(tmp_path, capsys):
    import os
    import threading

    from xla_harness.cli import main

    dump = tmp_path / "dump"
    dump.mkdir()
    hlo = (Path(__file__).parents[1] / "data/tied_sources.hlo").read_text()
    (dump / "module_0001.jit_step.cpu_after_optimizations.txt").write_text(hlo)
    os.mkfifo(dump / "module_0001.jit_step.cpu_after_optimizations-buffer-assignment.txt")
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(main(["scan", str(dump)])), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "scan hangs on a FIFO named like a buffer-assignment file"
    assert result == [2]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "buffer-assignment.txt is not a regular file" in err[0]
