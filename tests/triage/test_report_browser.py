"""The triage report as a person sees it: report.html rendered by headless Chromium (Debian's
``chromium``, installed by ``make setup-browser``) at 1400 x 1000 px. The page scrolls only
vertically, no command block scrolls sideways, every figure loads, and a screenshot is kept
(``out/browser/report.png``, the artifact a reviewer opens). A page that overflows is caught (a
planted 3000 px block)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.triage.test_report_figures import wide
from tests.triage.test_triage_where import _triage_folder
from xla_harness.triage.compiled import ScatterFusion, TargetVerdict
from xla_harness.triage.render import write_report

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "out" / "browser"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    BROWSER is None, reason="no chromium: `make setup-browser` installs Debian's package (CI runs it)")]

# Appended to a copy of the page: measures it once everything is laid out and writes the verdict
# into the DOM, which --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const d = document.documentElement;
  const imgs = [...document.images];
  const out = {scroll_width: d.scrollWidth, client_width: d.clientWidth, images: imgs.length,
               loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
               pre_scrolls: [...document.querySelectorAll('pre')].filter(p => p.scrollWidth > p.clientWidth + 1).length,
               widest: Math.max(0, ...[...document.body.querySelectorAll('*')].map(
                 e => e.getBoundingClientRect().right))};
  const p = document.createElement('pre'); p.id = 'probe'; p.textContent = 'PROBE' + JSON.stringify(out) + 'END';
  document.body.appendChild(p);
});
</script>"""


def _page(out: Path) -> Path:
    """A triage folder with every part of the report: a target with a 27-operand scatter fusion, the
    where table, what next, a variants stage (its rates figure)."""
    state = _triage_folder(out, variant_rows=({3: "loss", 10: "loss", 17: "loss"}, {}))  # a 2-row rate figure
    g = wide()
    v = TargetVerdict(target="cuda:h100", backend="gpu", versions={"jax-cuda13-plugin": "0.11.2", "jax": "0.11.2"},
                      instructions=14832, hazard=0, fused_producer=0, hazard_fusions=[], decision_fusions=[],
                      scatters=[ScatterFusion("scatter_fusion", "main", "scatter.1", 20, ["transpose"], "aliased",
                                              "aliased", "<site-packages>/flax/linen/linear.py:1184 (Embed.__call__)",
                                              "dense")],
                      compiler_states_aliasing=True, disagreements=0, nondeterministic=[], w_dims=[64, 32],
                      neighbourhoods=[g], devices=1, target_devices=8)
    state["stages"]["compile:cuda:h100"] = {"ok": True, "verdict": v.to_json(), "commands": [
        "xla-harness stress --program examples/quickstart/my_model.py:make --compile-only --target cuda:h100 "
        "--out " + "/a/long/output/folder/" * 6]}
    (out / "triage.json").write_text(json.dumps(state), encoding="utf-8")
    write_report(out, state)
    return out / "report.html"


def _render(page: Path, shot: Path) -> dict:
    probed = page.with_name(page.stem + ".probe.html")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    common = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1400,1000", "--virtual-time-budget=5000"]
    dom = subprocess.run([*common, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r"PROBE(\{.*?\})END", dom.stdout)
    assert found, f"chromium printed no measurement (exit {dom.returncode}): {dom.stderr[-500:]}"
    shot.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    return json.loads(found.group(1))


def test_the_report_fits_1400_px_and_every_figure_loads(tmp_path):
    page = _page(tmp_path / "t")
    got = _render(page, ARTIFACTS / "report.png")
    assert got["images"] >= 2 and got["loaded"] == got["images"], got
    assert got["scroll_width"] <= got["client_width"], got  # no horizontal scroll
    assert got["pre_scrolls"] == 0, got  # the commands wrap: nothing to scroll sideways to read
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000


def test_a_page_wider_than_the_window_is_caught(tmp_path):
    page = _page(tmp_path / "t")
    text = page.read_text(encoding="utf-8")
    page.write_text(text.replace("</body>", '<div style="width:3000px">planted</div></body>'), encoding="utf-8")
    got = _render(page, tmp_path / "wide.png")
    assert got["scroll_width"] > got["client_width"], got
