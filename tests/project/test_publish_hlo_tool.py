"""#34 item 11: tools/publish_hlo.py keeps the CLI's promises.

It deleted README.md (writing README.md.gz), replaced an existing .gz, blocked on a FIFO named like a
dump, and gave tracebacks for binary files, corrupt .gz, a folder named like a dump and a link to
/dev/zero. It checks every argument and dump before it writes anything.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import signal
from pathlib import Path

import pytest

from ..bad_input_cases import SMALL_HLO

ROOT = Path(__file__).resolve().parents[2]


DUMP = "x.after_optimizations.txt"


def _publish():
    spec = importlib.util.spec_from_file_location("publish_hlo", ROOT / "tools" / "publish_hlo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else "other")
            for p in root.rglob("*")}


class Hung(BaseException):
    pass


def _alarm(signum, frame):
    raise Hung("publish_hlo still running after 30 s")


@pytest.mark.parametrize("files,arg,says", [
    ({"README.md": b"# notes\n"}, "README.md", "is not named like a compiler dump"),
    ({DUMP: SMALL_HLO, DUMP + ".gz": gzip.compress(b"committed", mtime=0)}, DUMP, ".gz already exists"),
    ({"d/" + DUMP: None}, "d", "is not a regular file"),
    ({DUMP: None}, DUMP, "is not a regular file"),
    ({DUMP: bytes(range(256)) * 4}, DUMP, "not UTF-8 text"),
    ({DUMP + ".gz": b"\x1f\x8b\x08\x00garbage"}, DUMP + ".gz", "gzip"),
    ({DUMP + ".gz": gzip.compress(SMALL_HLO, mtime=0)[:-12]}, DUMP + ".gz", "not a whole gzip stream"),
    ({"d/" + DUMP: "dir"}, "d", "is not a regular file"),
    ({"d/a.after_optimizations.txt": SMALL_HLO, "d/b.after_optimizations.txt": b"\xff\xfe"}, "d", "not UTF-8"),
], ids=["readme", "gz-exists", "fifo-in-folder", "fifo", "binary", "corrupt-gz", "truncated-gz", "folder-named-so",
        "one-bad-among-good"])
def test_publish_checks_every_file_before_it_writes_one(files, arg, says, tmp_path, capsys):
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            os.mkfifo(tmp_path / rel)
        elif data == "dir":
            (tmp_path / rel).mkdir()
        else:
            (tmp_path / rel).write_bytes(data)
    before = _tree(tmp_path)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        code = _publish()([str(tmp_path / arg)])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and says in err[0], err
    assert _tree(tmp_path) == before


def test_publish_refuses_a_link_to_a_device(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    os.symlink("/dev/zero", tmp_path / "d" / DUMP)
    assert _publish()([str(tmp_path / "d")]) == 2
    assert "is not a regular file" in capsys.readouterr().err


def test_publish_still_scrubs_and_gzips_a_dump(tmp_path):
    body = "HloModule m\nENTRY e {\n  ROOT p = f32[4]{0} parameter(0)\n}\n\nFileNames\n1 \"/home/alice/x/y.py\"\n"
    (tmp_path / DUMP).write_text(body)
    assert _publish()([str(tmp_path)]) == 0
    assert not (tmp_path / DUMP).exists()
    assert gzip.decompress((tmp_path / (DUMP + ".gz")).read_bytes()).decode().endswith('1 "<path>/y.py"\n')
    assert _publish()([str(tmp_path)]) == 0  # a clean .gz stays as it is
