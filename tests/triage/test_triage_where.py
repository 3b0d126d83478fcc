"""What a triage's answer and report say beyond the paragraph, on triage folders written here (records
of the shape stress writes, no run): where each seed of the frozen and train stages failed (the
non-finite steps, the first bad value of each, the loss along the run), what to run next (every
command one this CLI parses), one interval convention in the paragraph, the tables and --json, and
``report DIR`` on a triage folder printing the triage's answer with every rate's k and n."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from xla_harness.cli import build_parser, main
from xla_harness.stress.report import stats
from xla_harness.stress.results import record_text, records
from xla_harness.triage.answer import answer
from xla_harness.triage.answer_record import BOUND_NOTE, where_line
from xla_harness.triage.render import write_report

PROGRAM = "examples/quickstart/my_model.py:make"
ENV = {"backend": "cpu", "device_count": 1, "device_kind": "cpu", "jax": "0.12.0.1", "jaxlib": "0.12.0.1"}
TIME = "2026-01-01T00:00:00+00:00"


def _spec(seed: int, steps: int, protocol: str, variants: list[str] | None = None) -> dict:
    spec = {"program": PROGRAM, "program_options": {}, "modes": ["full"], "remats": [True], "dtype": "f32",
            "seeds": [seed], "steps": steps, "protocol": protocol, "block": 8}
    return {**spec, "variants": variants} if variants else spec


def _round(folder: Path, seed: int, steps: int, bad: dict[int, str], protocol: str = "train",
           variant: str | None = None, variants: list[str] | None = None, mode: str = "w") -> None:
    """A round's stress.jsonl: ``steps`` steps of ``seed``, non-finite at the steps of ``bad`` (step: its
    first bad value), the loss falling from 2.0 where finite."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"variant": variant} if variant else {}
    lines = []
    if mode == "w":
        header = records.parse_header({"kind": "header", "spec": _spec(seed, steps, protocol, variants), "env": ENV,
                                       "time": TIME})
        lines.append(record_text.dumps(header))
    for start in range(0, steps, 8):
        end = min(start + 8, steps)
        st = [{"step": s, "finite": s not in bad, "first_bad": bad.get(s), "max_abs_update": 0.01,
               "loss": None if bad.get(s) == "loss" else 2.0 - s / 100} for s in range(start, end)]
        lines.append(record_text.dumps({"kind": "block", "label": records.label(config, PROGRAM), "config": config,
                                    "program": PROGRAM, "protocol": protocol, "seed": seed, "start": start,
                                    "end": end, "nonfinite": sum(not x["finite"] for x in st), "silent": 0,
                                    "steps": st, "env": ENV, "time": TIME}))
    with open(folder / "stress.jsonl", mode, encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


ISSUE_STEPS = {3: "loss", 10: "loss", 17: "loss", 47: "loss", 55: "loss"}


def _triage_folder(out: Path, train_bad: dict[int, str] | None = None, bundle: bool = True,
                   variant_rows: tuple[dict, dict] | None = None) -> dict:
    """A triage folder as triage leaves it: frozen clean (seed 1, 59 calls), train with ``train_bad`` in
    seed 1 (59 steps) and a clean seed 2 (118 steps), optionally variants and a bundle."""
    _round(out / "stages/frozen/round-1", 1, 59, {}, protocol="frozen")
    _round(out / "stages/train/round-1", 1, 59, ISSUE_STEPS if train_bad is None else train_bad)
    _round(out / "stages/train/round-2", 2, 118, {})
    train_answer = "fails" if (ISSUE_STEPS if train_bad is None else train_bad) else "bounded"
    stages: dict = {
        "frozen": {"ok": True, "rounds": ["stages/frozen/round-1"], "answer": "bounded", "commands": []},
        "train": {"ok": True, "rounds": ["stages/train/round-1", "stages/train/round-2"], "answer": train_answer,
                  "commands": []}}
    if variant_rows is not None:
        folder = out / "stages/variants/round-1"
        for i, (name, bad) in enumerate(zip(("baseline", "barrier"), variant_rows, strict=True)):
            _round(folder, 1, 59, bad, variant=name, variants=["baseline", "barrier"], mode="w" if i == 0 else "a")
        stages["variants"] = {"ok": True, "rounds": ["stages/variants/round-1"], "answer": "differs",
                              "variants": ["baseline", "barrier"], "commands": []}
    if bundle:
        (out / "repro.tar.gz").write_bytes(b"")
        stages["bundle"] = {"ok": True, "bundle": "repro.tar.gz", "commands": []}
    state = {"kind": "triage", "schema": 1, "backend": "cpu", "stages": stages,
             "spec": {"program": PROGRAM, "options": [], "targets": ["host"], "hlo": [], "budget_s": 600.0,
                      "rate_of_interest": 0.05, "inject": None, "inject_rate": 0.0}}
    (out / "triage.json").write_text(json.dumps(state), encoding="utf-8")
    return state


# ----------------------------------------------------------------------------- where


def test_the_answer_and_the_report_name_the_non_finite_steps_their_first_bad_value_and_the_loss(tmp_path):
    state = _triage_folder(tmp_path)
    ans = write_report(tmp_path, state)
    text = ans.text()
    seed1 = next(t for t in ans.where if t.stage == "train" and t.seed == 1)
    assert [s for s, _, _ in seed1.bad] == [3, 10, 17, 47, 55]
    said = "5 non-finite: 3 (loss), 10 (loss), 17 (loss), 47 (loss), 55 (loss)"
    assert said in where_line(seed1) and said in text
    assert "last finite 1.42 at step 58" in where_line(seed1)  # step 58: 2.0 - 0.58
    assert "2 @0 -> " in where_line(seed1)  # the trajectory starts at step 0
    clean = next(t for t in ans.where if t.stage == "train" and t.seed == 2)
    assert "no non-finite step" in where_line(clean)
    assert [t.stage for t in ans.where] == ["frozen", "train", "train"]
    md = (tmp_path / "report.md").read_text()
    page = (tmp_path / "report.html").read_text()
    assert "## Where" in md and "5: 3 (loss), 10 (loss), 17 (loss), 47 (loss), 55 (loss)" in md
    assert "<h2>Where</h2>" in page and "5: 3 (loss), 10 (loss), 17 (loss), 47 (loss), 55 (loss)</td>" in page
    assert "last finite 1.42 at step 58" in md and "last finite 1.42 at step 58" in page


def test_many_non_finite_steps_are_listed_as_the_first_ones_and_the_count(tmp_path):
    bad = {s: "opt_state['mu']" for s in range(4, 44, 2)}  # 20 steps
    ans = answer(_triage_folder(tmp_path, bad), tmp_path)
    line = where_line(next(t for t in ans.where if t.stage == "train" and t.seed == 1))
    assert "20 non-finite: 4 (opt_state['mu']), 6 (opt_state['mu'])" in line
    assert "18 (opt_state['mu']), ... (20 in all)" in line and "20 (opt_state" not in line


# ----------------------------------------------------------------------------- what next


def _parses(command: str) -> None:
    """The command is one this CLI takes: argparse accepts it (exit 2 with one error line if not)."""
    argv = shlex.split(command)
    assert argv[0] == "xla-harness"
    build_parser().parse_args(argv[1:])


def test_what_next_gives_commands_this_cli_takes_replaying_the_first_non_finite_step(tmp_path):
    ans = answer(_triage_folder(tmp_path, variant_rows=({5: "loss", 9: "loss", 12: "loss", 20: "loss",
                                                         30: "loss", 31: "loss", 40: "loss"}, {})), tmp_path)
    commands = [c for _, c in ans.next_steps]
    for c in commands:
        _parses(c)
    replay = next(c for why, c in ans.next_steps if why.startswith("replay train step 3 of seed 1"))
    assert shlex.split(replay)[:6] == ["xla-harness", "stress", "--program", PROGRAM, "--protocol", "train"]
    assert "--seeds 1 --steps 4 " in replay
    table = next(c for why, c in ans.next_steps if why.startswith("the train stage's per-seed table"))
    assert shlex.split(table)[2:] == [str(tmp_path / "stages/train/round-1"), str(tmp_path / "stages/train/round-2")]
    check = next(c for why, c in ans.next_steps if why.startswith("check the repro bundle"))
    assert shlex.split(check)[1:] == ["bundle", "--check", str(tmp_path / "repro.tar.gz"), "--run-program"]
    confirm = next(c for why, c in ans.next_steps if why.startswith("the barrier variant lowered the rate"))
    assert "--variants baseline,barrier --seeds 2 " in confirm
    assert "What next:" in ans.text() and replay in ans.text()
    write_report(tmp_path)
    assert "## What next" in (tmp_path / "report.md").read_text() and replay in (tmp_path / "report.md").read_text()


def test_what_next_suggests_only_what_applies(tmp_path):
    """No failure, no bundle, no variant that helped: no replay, no bundle check, no confirmation; the
    suggestion is a tighter triage in a new folder."""
    ans = answer(_triage_folder(tmp_path, {}, bundle=False, variant_rows=({}, {})), tmp_path)
    assert ans.exit_code == 0
    whys = [why for why, _ in ans.next_steps]
    assert not [w for w in whys if w.startswith(("replay", "check the repro bundle", "the barrier variant"))]
    assert len(ans.next_steps) == 1 and whys[0].startswith("nothing found")
    cmd = ans.next_steps[0][1]
    _parses(cmd)
    assert "--rate-of-interest 0.01 " in cmd and cmd.endswith(f"--out {tmp_path}-0.01")


def test_a_suggestion_this_cli_does_not_take_is_caught(capsys):
    with pytest.raises(SystemExit):
        _parses("xla-harness stress --replay-step 3")
    assert capsys.readouterr().err.startswith("error:")


# ----------------------------------------------------------------------------- one interval


def test_the_paragraph_and_the_tables_give_the_same_bound_for_each_rate(tmp_path):
    state = _triage_folder(tmp_path)
    ans = write_report(tmp_path, state)
    md = (tmp_path / "report.md").read_text()
    said = dict(re.findall(r"(frozen|train) \d+/\d+ non-finite \w+ \(at most ([\d.]+%) at 95%\)", ans.paragraph))
    assert said == {"frozen": f"{stats.upper_bound(0, 59):.2%}", "train": f"{stats.upper_bound(5, 177):.2%}"}
    for stage, title in (("frozen", "## Frozen protocol"), ("train", "## Train protocol")):
        section = md[md.index(title):]
        head, _, row = [line for line in section.splitlines() if line.startswith("|")][:3]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[[c.strip() for c in head.strip("|").split("|")].index("at most (95%)")] == said[stage]
    assert "[0.0" not in md  # no two-sided interval anywhere
    assert md.count(BOUND_NOTE) == 1 and (tmp_path / "report.html").read_text().count(BOUND_NOTE) == 1


# ----------------------------------------------------------------------------- report DIR


def test_report_on_a_triage_folder_prints_the_triage_s_answer(tmp_path, capsys):
    _triage_folder(tmp_path)
    compile_dir = tmp_path / "stages/compile-host/compile"
    compile_dir.mkdir(parents=True)
    (compile_dir / "compile.jsonl").write_text("")  # what made report take the folder for a compile matrix
    assert main(["report", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    ans = answer(json.loads((tmp_path / "triage.json").read_text()), tmp_path)
    assert out.startswith(ans.text() + "\n") and "Where (" in out and "What next:" in out
    assert f"report: not drawn (xla-harness report {tmp_path} --html draws it)" in out
    assert not (tmp_path / "report.md").exists()  # printing draws nothing


def test_report_json_on_a_triage_folder_gives_every_rate_its_k_and_n(tmp_path, capsys):
    _triage_folder(tmp_path, variant_rows=({5: "loss"}, {}))
    assert main(["report", str(tmp_path), "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    for name, run in got["local"].items():
        assert run["rows"], name
        for row in run["rows"]:
            assert {"k", "n", "upper"} <= set(row)
            for seed in row["per_seed"].values():
                assert {"k", "n", "upper"} <= set(seed)
    train = got["local"]["train"]["rows"][0]
    assert (train["k"], train["n"]) == (5, 177) and train["per_seed"]["1"]["k"] == 5
    assert "vs_baseline" in got["local"]["variants"]["rows"][1]
    assert [s["step"] for s in got["where"][1]["nonfinite_steps"]] == [3, 10, 17, 47, 55]
    assert got["next"] and got["interval"] == BOUND_NOTE


@pytest.mark.parametrize("argv", [["{d}", "{d}/other"], ["{d}", "--plot", "{d}/x.png"],
                                  ["{d}", "--html", "--json"]])
def test_report_refuses_a_triage_folder_with_what_it_cannot_mix(tmp_path, capsys, argv):
    _triage_folder(tmp_path)
    (tmp_path / "other").mkdir()
    assert main(["report", *[a.format(d=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "is a triage folder" in err[0]


def test_report_on_a_broken_triage_json_is_one_error_line(tmp_path, capsys):
    (tmp_path / "triage.json").write_text("{")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "not a triage record" in err[0]


def test_report_html_on_folders_none_a_triage_s_says_so(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--html"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a triage folder (no triage.json)" in err[0] and "is a triage folder" not in err[0]
