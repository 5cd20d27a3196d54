"""`fabriclab compare`'s pictures (`fabriclab.render`): compare.png and compare.html from hand-made rows.

Two series at three sizes, every value written here. The page must parse as HTML5 without an error, hold
only inlined images that decode (each a real picture, over 10 KB), name what it shows, and draw one line per
series. In CI (CI=true) the page is also loaded in headless Chromium, which must report no console error,
no exception and no failed load; the same check is run on a page that logs an error, so it can fail.
Outside CI, without Chromium, that part is skipped.
"""
from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import html5lib
import pytest
from PIL import Image

from fabriclab import compare as cmp
from fabriclab import compare_output
from fabriclab import render

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]

LABELS = ("step time", "scaling efficiency", "compute", "exposed communication", "idle", "hottest link")
PYRAMID, DUAL = "pyramid-1024 / ecmp", "dual-plane-1024 / adaptive"
CHROMIUM_TIMEOUT_S = 30.0


def _row(topology: str, routing: str, gpus: int, step_s: float, eff: float, util: float, exposed: dict[str, float],
         idle: float, hottest: dict[str, float]) -> cmp.Row:
    return cmp.Row(topology=topology, fabric=f"{topology.split('-')[0]}-{gpus}", routing=routing, gpus=gpus, steps=4,
                   step_mean_us=step_s * 1e6, step_p99_us=step_s * 1.1e6, utilisation=util,
                   comm_share=sum(exposed.values()), busbw_bps=3.2e11, hot_link_share=0.1, load_max_over_mean=1.5,
                   ecmp_collisions=2, ecmp_choices=40, idle_share=idle, exposed_by_group=exposed,
                   hottest_by_tier=hottest, efficiency=eff)


#: pyramid + ECMP slows with size (its data-parallel traffic is exposed more), dual-plane + adaptive less so
ROWS = (
    _row("pyramid-1024", "ecmp", 128, 2.0, 1.0, 0.70, {"tp": 0.02, "pp": 0.05, "dp": 0.13}, 0.10,
         {"tor->agg": 0.71, "agg->tor": 0.64, "agg->spine": 0.52}),
    _row("pyramid-1024", "ecmp", 256, 2.5, 0.8, 0.56, {"tp": 0.02, "pp": 0.06, "dp": 0.26}, 0.10,
         {"tor->agg": 0.86, "agg->tor": 0.70, "agg->spine": 0.69}),
    _row("pyramid-1024", "ecmp", 512, 3.2, 0.625, 0.44, {"tp": 0.02, "pp": 0.07, "dp": 0.37}, 0.10,
         {"tor->agg": 0.97, "agg->tor": 0.81, "agg->spine": 0.90}),
    _row("dual-plane-1024", "adaptive", 128, 1.9, 1.0, 0.74, {"tp": 0.02, "pp": 0.04, "dp": 0.10}, 0.10,
         {"tor->agg": 0.55, "agg->tor": 0.50, "agg->spine": 0.41}),
    _row("dual-plane-1024", "adaptive", 256, 2.0, 0.95, 0.70, {"tp": 0.02, "pp": 0.04, "dp": 0.14}, 0.10,
         {"tor->agg": 0.58, "agg->tor": 0.52, "agg->spine": 0.44}),
    _row("dual-plane-1024", "adaptive", 512, 2.1, 0.905, 0.67, {"tp": 0.02, "pp": 0.05, "dp": 0.16}, 0.10,
         {"tor->agg": 0.62, "agg->tor": 0.55, "agg->spine": 0.47}),
)
META = {"trace": "llm:gpt3-175b", "sizes": [128, 256, 512], "complete": True, "rows_expected": 6}
TITLE = "fabriclab compare: llm:gpt3-175b"


@pytest.fixture(scope="module")
def page() -> str:
    return render.compare_html(ROWS, TITLE, META)


def _images(page: str) -> list[bytes]:
    tree = html5lib.parse(page, namespaceHTMLElements=False)
    srcs = [img.get("src", "") for img in tree.iter("img")]
    assert all(s.startswith("data:image/png;base64,") for s in srcs), [s[:40] for s in srcs]
    return [base64.b64decode(s.split(",", 1)[1], validate=True) for s in srcs]


def _text(page: str) -> str:
    tree = html5lib.parse(page, namespaceHTMLElements=False)
    return " ".join(" ".join(el.itertext()) for el in tree.iter("body")).lower()


# --- the page and its picture ------------------------------------------------------------------------------

def test_the_page_is_html5_without_a_parse_error(page: str) -> None:
    tree = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(page)  # raises on any parse error
    assert tree.findtext("head/title") == TITLE
    assert tree.findtext("body/h1") == TITLE


def test_the_parse_check_can_fail() -> None:
    with pytest.raises(html5lib.html5parser.ParseError):
        html5lib.HTMLParser(strict=True).parse("<!DOCTYPE html><p><b>x</p></i>")


def test_every_image_is_inlined_and_decodes_to_a_real_picture(page: str) -> None:
    images = _images(page)
    assert len(images) == 1
    for data in images:
        assert len(data) > 10_000
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # decodes every pixel: a truncated or corrupt PNG raises here
            assert im.format == "PNG" and im.size == (render.WIDTH_IN * 100, render.HEIGHT_IN * 100)
            assert len(im.getcolors(maxcolors=1 << 20) or range(1 << 20)) > 50  # drawn, not a blank canvas


def test_the_page_holds_no_script_and_no_link(page: str) -> None:
    tree = html5lib.parse(page, namespaceHTMLElements=False)
    assert not list(tree.iter("script")) and not list(tree.iter("link")) and not list(tree.iter("a"))
    assert not re.search(r"(?:src|href)\s*=\s*\"(?!data:)", page)


def test_the_page_names_what_it_shows(page: str) -> None:
    text = _text(page)
    assert [label for label in LABELS if label not in text] == []
    alt = " ".join(img.get("alt", "") for img in html5lib.parse(page, namespaceHTMLElements=False).iter("img"))
    assert all(label in alt for label in LABELS)


def test_the_table_holds_every_row_by_series_then_gpus(page: str) -> None:
    tree = html5lib.parse(page, namespaceHTMLElements=False)
    rows_table = tree.findall(".//table")[0]
    cells = [[" ".join(td.itertext()) for td in tr.findall("td")] for tr in rows_table.iter("tr")][1:]
    assert [(c[0], c[2]) for c in cells] == [(PYRAMID, "128"), (PYRAMID, "256"), (PYRAMID, "512"),
                                             (DUAL, "128"), (DUAL, "256"), (DUAL, "512")]
    assert cells[2][3] == "3.200 s" and cells[2][5] == "0.625"  # step time mean (4 figures), scaling efficiency
    assert cells[2][8] == "tp 2.0 %, pp 7.0 %, dp 37.0 %"  # exposed communication by group, in GROUP_ORDER
    assert cells[2][10] == "tor->agg 97.0 %, agg->tor 81.0 %, agg->spine 90.0 %"  # lowest tier, uplink first


def test_one_line_per_series_in_the_legend_and_both_line_panels() -> None:
    fig = render.compare_figure(ROWS, TITLE)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [PYRAMID, DUAL]
    step_ax, eff_ax = fig.axes[:2]
    assert [line.get_label() for line in step_ax.get_lines() if not line.get_label().startswith("_")] == [PYRAMID, DUAL]
    solid = [line for line in eff_ax.get_lines() if len(line.get_xdata()) == 3]
    assert [list(line.get_ydata()) for line in solid] == [[1.0, 0.8, 0.625], [1.0, 0.95, 0.905]]


def test_the_step_split_stacks_compute_exposed_by_group_and_idle() -> None:
    split_ax = render.compare_figure(ROWS, TITLE).axes[2]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in split_ax.containers}
    assert list(bars) == ["compute", "exposed communication: tp", "exposed communication: pp",
                          "exposed communication: dp", "idle"]
    assert bars["compute"] == pytest.approx([0.70, 0.56, 0.44, 0.74, 0.70, 0.67])
    assert bars["exposed communication: dp"] == pytest.approx([0.13, 0.26, 0.37, 0.10, 0.14, 0.16])
    tops = [sum(h[i] for h in bars.values()) for i in range(6)]
    assert tops == pytest.approx([1.0] * 6)  # every hand-made step is split whole


def test_the_hottest_link_panel_draws_each_tier_per_row() -> None:
    hot_ax = render.compare_figure(ROWS, TITLE).axes[3]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in hot_ax.containers}
    assert list(bars) == ["tor->agg", "agg->tor", "agg->spine"]  # lowest tier first, its uplink first
    assert bars["tor->agg"] == pytest.approx([0.71, 0.86, 0.97, 0.55, 0.58, 0.62])


def test_rows_of_fabrics_with_other_tiers_sit_side_by_side_in_their_own_slots() -> None:
    other = _row("dual-plane-1024", "adaptive", 128, 1.9, 1.0, 0.74, {"dp": 0.16}, 0.10,
                 {"leaf->spine": 0.4, "spine->leaf": 0.3})
    hot_ax = render.compare_figure([ROWS[0], other], TITLE).axes[3]
    xs = {c.get_label(): [round(p.get_x() + p.get_width() / 2, 6) for p in c.patches] for c in hot_ax.containers}
    # each row's own tiers centred on its x (0, then 2 after the gap), a third of 0.8 wide each
    w = 0.8 / 3
    assert xs == {"tor->agg": [round(-w, 6)], "agg->tor": [0.0], "leaf->spine": [round(2 - w / 2, 6)],
                  "spine->leaf": [round(2 + w / 2, 6)], "agg->spine": [round(w, 6)]}


def test_no_rows_draws_a_message_not_an_error() -> None:
    png = render.compare_png([], "nothing yet")
    with Image.open(io.BytesIO(png)) as im:
        im.load()
    tree = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(
        render.compare_html([], "nothing yet", {"complete": False, "rows_expected": 6}))
    assert "incomplete: 0 of 6 rows finished" in " ".join(tree.find("body").itertext()).lower()


def test_compare_write_draws_the_png_and_the_page_beside_the_json(tmp_path: Path) -> None:
    paths = compare_output.write(list(ROWS), [], tmp_path, META)
    assert [p.name for p in paths[3:]] == ["compare.png", "compare.html"]
    assert paths[0].name == "compare.json" and json.loads(paths[0].read_text())["rows"][0]["gpus"] == 128
    png = (tmp_path / "compare.png").read_bytes()
    assert _images((tmp_path / "compare.html").read_text(encoding="utf-8")) == [png]


def test_the_readme_picture_script_draws_a_real_comparison(tmp_path: Path) -> None:
    golden = ROOT / "tests" / "golden" / "compare-small-128-1024.json"
    out = tmp_path / "docs" / "compare.png"
    res = subprocess.run([sys.executable, "benchmarks/compare_picture.py", str(golden), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"wrote {out} (4 rows)"
    with Image.open(out) as im:
        im.load()
        assert im.size == (render.WIDTH_IN * 100, render.HEIGHT_IN * 100)


# --- the page in a browser -----------------------------------------------------------------------------------

def _chromium() -> str:
    exe = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must load the page in Chromium: install the Debian package chromium (setup.sh --test)")
        pytest.skip("chromium is not installed (Debian package chromium; scripts/setup.sh --test installs it)")
    return exe


class _DevTools:
    """The Chrome DevTools protocol over `--remote-debugging-pipe`: JSON messages ending in NUL, commands
    written to the browser's fd 3, answers and events read from its fd 4, to a deadline."""

    def __init__(self, to_browser: int, from_browser: int, deadline: float) -> None:
        self.to_browser, self.from_browser, self.deadline = to_browser, from_browser, deadline
        self.buf = b""
        self.last_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.last_id += 1
        msg: dict[str, Any] = {"id": self.last_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self.to_browser, json.dumps(msg).encode() + b"\0")
        reply = self.until(lambda m, i=self.last_id: m.get("id") == i)
        if "error" in reply:
            raise AssertionError(f"chromium: {method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def until(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "method" in msg:
                    self.events.append(msg)
                if match(msg):
                    return dict(msg)
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_browser], [], [], left)[0]:
                raise AssertionError(f"chromium did not answer within {CHROMIUM_TIMEOUT_S:g} s")
            chunk = os.read(self.from_browser, 1 << 16)
            if not chunk:
                raise AssertionError("chromium closed its DevTools pipe")
            self.buf += chunk


def _problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors and assertions, uncaught exceptions and error log entries (a failed load among them)."""
    out = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            out.append(f"console.{p['type']}: {args}")
        elif e["method"] == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}")
        elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"{p['entry'].get('source')}: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
    return out


def _high_fd(fd: int) -> int:
    """`fd` moved to 10 or above, so that putting the pipes at the browser's fds 3 and 4 overwrites neither."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


def load_in_chromium(page: Path) -> tuple[list[str], list[list[int]]]:
    """The page loaded in headless Chromium: what went wrong (`_problems`, and a failed navigation), and
    each image's decoded (width, height)."""
    exe = _chromium()
    cmd_r, cmd_w = map(_high_fd, os.pipe())
    ev_r, ev_w = map(_high_fd, os.pipe())

    def at_3_and_4() -> None:  # in the child, before exec
        os.dup2(cmd_r, 3)
        os.dup2(ev_w, 4)

    with tempfile.TemporaryDirectory() as profile, tempfile.TemporaryFile() as log:
        # as root (CI, this lab's VMs) Chromium starts only without its sandbox
        proc = subprocess.Popen([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                                 "--no-first-run", f"--user-data-dir={profile}", "about:blank"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(3, 4),
                                preexec_fn=at_3_and_4)
        os.close(cmd_r)
        os.close(ev_w)
        tools = _DevTools(cmd_w, ev_r, time.monotonic() + CHROMIUM_TIMEOUT_S)
        try:
            target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            sid = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                tools.send(f"{domain}.enable", session=sid)
            nav = tools.send("Page.navigate", {"url": page.resolve().as_uri()}, session=sid)
            tools.until(lambda m: m.get("method") == "Page.loadEventFired" and m.get("sessionId") == sid)
            # answered after every event the page sent before it
            sizes = tools.send("Runtime.evaluate", {"expression": "JSON.stringify(Array.from(document.images, "
                                                    "i => [i.naturalWidth, i.naturalHeight]))"}, session=sid)
            tools.send("Browser.close")
        except AssertionError as e:
            log.seek(0)
            raise AssertionError(f"{e}; chromium's log ends: {log.read()[-2000:].decode(errors='replace')}") from None
        finally:
            os.close(cmd_w)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(ev_r)
    failed = [f"navigation: {nav['errorText']}"] if nav.get("errorText") else []
    return failed + _problems(tools.events), json.loads(sizes["result"]["value"])


@pytest.mark.timeout(120)
def test_chromium_loads_the_page_without_a_console_error(page: str, tmp_path: Path) -> None:
    _chromium()
    path = tmp_path / "compare.html"
    path.write_text(page, encoding="utf-8")
    problems, sizes = load_in_chromium(path)
    assert problems == []
    assert sizes == [[render.WIDTH_IN * 100, render.HEIGHT_IN * 100]]  # the browser decoded the picture too


@pytest.mark.timeout(120)
def test_the_browser_check_fails_on_a_page_with_a_console_error(tmp_path: Path) -> None:
    _chromium()
    path = tmp_path / "bad.html"
    path.write_text('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>bad</title></head><body>'
                    '<img alt="missing" src="missing.png"><script>console.error("x")</script></body></html>')
    problems, sizes = load_in_chromium(path)
    assert "console.error: x" in problems
    assert any("missing.png" in p for p in problems)  # a failed load is one too
    assert sizes == [[0, 0]]
