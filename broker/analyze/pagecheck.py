"""Look at a report page the way a person does: headless Chromium at a given width.

``python3 -m plugbroker.analyze.pagecheck report/report.html --width 1280 --screenshot page.png``
loads the page in Debian's ``chromium`` (``apt-get install chromium``), measures it (is it wider
than the window, does any table or plot overflow its box, is any SVG text cut off at the edge of
its plot) and writes a screenshot. It exits 1 and says what is wrong when the page needs
horizontal scrolling or clips a label, so it can gate a change to the page.

The measuring is done by a small script added to a copy of the page (the report itself has no
scripts): Chromium runs it, writes the findings into the DOM, and ``--dump-dom`` prints them.
Nothing is fetched from the network; the browser runs with a throw-away profile.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: the browsers tried, in order
BROWSERS = ("chromium", "chromium-browser", "google-chrome")

#: flags for a quiet, offline, throw-away headless run (the profile directory is added)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--hide-scrollbars",
)

PROBE = """<script>
(function () {
  var out = {problems: []};
  var de = document.documentElement;
  out.scrollWidth = de.scrollWidth;
  out.clientWidth = de.clientWidth;
  out.innerWidth = window.innerWidth;
  if (de.scrollWidth > window.innerWidth) {
    out.problems.push('the page is ' + de.scrollWidth + ' px wide in a ' + window.innerWidth +
                      ' px window');
  }
  var boxes = document.querySelectorAll('.scroll, .plots, .queue, table, svg');
  for (var i = 0; i < boxes.length; i++) {
    var b = boxes[i];
    var r = b.getBoundingClientRect();
    if (r.right > window.innerWidth + 0.5) {
      out.problems.push(b.tagName.toLowerCase() + (b.className && b.className.baseVal === undefined
        ? '.' + b.className : '') + ' ends at ' + Math.round(r.right) + ' px');
    } else if (b.scrollWidth > b.clientWidth + 1 && b.tagName !== 'svg') {
      out.problems.push(b.tagName.toLowerCase() + '.' + b.className + ' scrolls sideways (' +
                        b.scrollWidth + ' px of content in ' + b.clientWidth + ' px)');
    }
  }
  var svgs = document.querySelectorAll('svg');
  for (var s = 0; s < svgs.length; s++) {
    var box = svgs[s].getBoundingClientRect();
    var texts = svgs[s].querySelectorAll('text');
    for (var t = 0; t < texts.length; t++) {
      var tb = texts[t].getBoundingClientRect();
      if (tb.width === 0) continue;
      if (tb.left < box.left - 0.5 || tb.right > box.right + 0.5 ||
          tb.top < box.top - 0.5 || tb.bottom > box.bottom + 0.5) {
        out.problems.push('label "' + texts[t].textContent + '" is cut off in the plot "' +
                          (svgs[s].getAttribute('aria-label') || '') + '"');
      }
    }
  }
  var pre = document.createElement('pre');
  pre.id = 'pagecheck-result';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


class NoBrowser(RuntimeError):
    """No Chromium on this machine."""


@dataclass
class PageCheck:
    """What the browser saw."""

    width: int
    scroll_width: int
    problems: list[str] = field(default_factory=list)
    screenshot: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def find_browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise NoBrowser(
        "no headless browser: install Debian's chromium (apt-get install chromium); "
        f"looked for {', '.join(BROWSERS)} on the PATH"
    )


def _run(browser: str, args: list[str], profile: Path, timeout: float) -> str:
    cmd = [browser, *FLAGS, f"--user-data-dir={profile}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{Path(browser).name} failed ({done.returncode}): {' / '.join(tail)}")
    return done.stdout


def check_page(
    page: str | Path,
    *,
    width: int = 1280,
    height: int = 900,
    screenshot: str | Path | None = None,
    shot_height: int = 2200,
    timeout: float = 90.0,
) -> PageCheck:
    """Load ``page`` in headless Chromium ``width`` px wide; measure it, take a screenshot.

    :raises NoBrowser: no Chromium on the PATH.
    """
    browser = find_browser()
    page = Path(page).resolve()
    with tempfile.TemporaryDirectory(prefix="plugbroker-pagecheck-") as tmp:
        tmpdir = Path(tmp)
        probe = tmpdir / "probe.html"
        text = page.read_text(encoding="utf-8")
        probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
        dom = _run(
            browser,
            [f"--window-size={width},{height}", "--dump-dom", probe.as_uri()],
            tmpdir / "profile-1",
            timeout,
        )
        start = dom.find('<pre id="pagecheck-result">')
        if start < 0:
            raise RuntimeError("the browser did not run the measuring script")
        raw = dom[start:].split(">", 1)[1].split("</pre>", 1)[0]
        import html

        found = json.loads(html.unescape(raw))
        result = PageCheck(width, int(found["scrollWidth"]), list(found["problems"]))
        if screenshot is not None:
            shot = Path(screenshot).resolve()
            shot.parent.mkdir(parents=True, exist_ok=True)
            _run(
                browser,
                [f"--window-size={width},{shot_height}", f"--screenshot={shot}", page.as_uri()],
                tmpdir / "profile-2",
                timeout,
            )
            result.screenshot = shot
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m plugbroker.analyze.pagecheck",
        description="check a report page in headless Chromium: no horizontal scrolling, "
        "no clipped label; optionally save a screenshot",
    )
    p.add_argument("page", help="the HTML page (report/report.html)")
    p.add_argument("--width", type=int, default=1280, help="window width in px (default 1280)")
    p.add_argument("--screenshot", help="write a PNG of the top of the page here")
    p.add_argument("--shot-height", type=int, default=2200, help="screenshot height in px")
    args = p.parse_args(argv)
    try:
        res = check_page(
            args.page, width=args.width, screenshot=args.screenshot, shot_height=args.shot_height
        )
    except (NoBrowser, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"pagecheck: {exc}", file=sys.stderr)
        return 2
    if res.screenshot is not None:
        print(f"screenshot: {res.screenshot}")
    if res.ok:
        print(
            f"{args.page}: fits {res.width} px (page {res.scroll_width} px wide), no clipped label"
        )
        return 0
    print(f"{args.page} at {res.width} px:")
    for problem in res.problems:
        print(f"  {problem}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
