"""Refusals that name their cause: a path that does not exist is "no such file" (not "not a regular
file"), a folder given as a bundle is said to be a folder."""

from __future__ import annotations

import pytest

from xla_harness.cli import main
from xla_harness.hlo.parser import HloParseError, parse_file


def test_a_missing_hlo_file_is_no_such_file(tmp_path):
    with pytest.raises(HloParseError, match=r"nothere\.hlo:1: cannot read: no such file$"):
        parse_file(tmp_path / "nothere.hlo")
    (tmp_path / "dangling.hlo").symlink_to(tmp_path / "gone")
    with pytest.raises(HloParseError, match="a link to nothing"):
        parse_file(tmp_path / "dangling.hlo")


def test_a_folder_given_as_a_bundle_is_said_to_be_one(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    assert main(["bundle", "--check", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'd'}: a folder, not a bundle (a .tar.gz that `bundle --out` wrote)"]
    assert main(["bundle", "--check", str(tmp_path / "nothere.tar.gz")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'nothere.tar.gz'}: no such file"
