from pathlib import Path

from harness.paths import REPO, shown


def test_committed_evidence_names_no_path_of_this_machine():
    home = Path.home()
    text = f"g++ -I{home}/.cache/x/include {REPO}/harness/a.cc -o {REPO}"
    assert shown(text) == "g++ -I~/.cache/x/include harness/a.cc -o ."
    assert shown("/opt/other/file") == "/opt/other/file"
