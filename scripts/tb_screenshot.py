#!/usr/bin/env python
"""Screenshots of TensorBoard's dashboards in a real (headless) browser, to check what users see.

    .venv/bin/python scripts/tb_screenshot.py results/runs --out results/tb_screenshots

Starts `tensorboard --logdir LOGDIR` on a free local port, waits until it has loaded the runs,
then has headless Chromium render and screenshot these pages into --out:

    scalars.png          the time-series dashboard (the run list: experiment/precision-budget/seedN)
    hparams.png          the HParams table (loss scaling, model, precision, status, variant)
    custom_scalars.png   one chart per experiment and budget with its presets side by side

It needs a Chromium-family browser on the PATH (or --browser): on Debian/Ubuntu
`apt-get install chromium-headless-shell` (or `chromium`); elsewhere Chrome or Chromium. The
browser's own headless screenshot mode is used, so no Python browser package is needed. Exit
status: 0 when every screenshot was written, 2 when no browser or TensorBoard was found, 1 when
TensorBoard or the browser failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

# the browsers tried, in order, when --browser is not given
BROWSERS = (
    "chromium-headless-shell",
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
    "chrome",
    "headless_shell",
)
# page name -> the TensorBoard route (the part after '#')
PAGES = {"scalars": "timeseries", "hparams": "hparams", "custom_scalars": "custom_scalars"}


def find_browser(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).exists() or shutil.which(explicit) else None
    return next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_runs(url: str, proc: subprocess.Popen, timeout_s: float) -> list[str]:
    """The runs TensorBoard lists, once it lists any (or [] when the time is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited with status {proc.returncode}")
        try:
            runs = json.load(urllib.request.urlopen(url + "data/runs", timeout=5))
            if runs:
                return runs
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    return []


def screenshot(browser: str, url: str, out: Path, size: str, budget_ms: int) -> None:
    """The browser's headless screenshot mode; the virtual-time budget lets the dashboard's
    scripts fetch and draw the data before the picture is taken."""
    with tempfile.TemporaryDirectory(prefix="tb-shot-") as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",  # needed as root (containers, CI)
            "--use-angle=swiftshader",  # software WebGL: the time-series charts draw with it
            "--enable-unsafe-swiftshader",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={size}",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={out}",
            url,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{Path(browser).name} failed on {url}: {done.stderr[-800:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path, help="folder of runs (e.g. results/runs)")
    parser.add_argument("--out", type=Path, default=Path("results/tb_screenshots"))
    parser.add_argument("--browser", help="path or name of a Chromium-family browser")
    parser.add_argument("--size", default="1600,1000", help="window size W,H (default 1600,1000)")
    parser.add_argument(
        "--wait-ms", type=int, default=15000, help="virtual time for the page to draw (ms)"
    )
    parser.add_argument("--pages", default=",".join(PAGES), help=f"of {', '.join(PAGES)}")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    browser = find_browser(args.browser)
    if browser is None:
        print(
            "tb_screenshot: no Chromium-family browser found (tried "
            f"{', '.join(BROWSERS) if not args.browser else args.browser}). Install one, e.g. "
            "`apt-get install chromium-headless-shell`, or pass --browser PATH.",
            file=sys.stderr,
        )
        return 2
    if not args.logdir.is_dir():
        print(f"tb_screenshot: no folder {args.logdir}", file=sys.stderr)
        return 2
    pages = [p for p in args.pages.split(",") if p]
    unknown = sorted(set(pages) - set(PAGES))
    if unknown:
        print(f"tb_screenshot: unknown pages {unknown}; choose from {list(PAGES)}", file=sys.stderr)
        return 2

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    tensorboard = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(args.logdir)]
        + ["--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        runs = wait_for_runs(url, tensorboard, timeout_s=120)
        if not runs:
            print(f"tb_screenshot: TensorBoard found no runs under {args.logdir}", file=sys.stderr)
            return 1
        print(f"tb_screenshot: TensorBoard at {url} lists {len(runs)} runs: {', '.join(runs)}")
        args.out.mkdir(parents=True, exist_ok=True)
        for page in pages:
            target = args.out / f"{page}.png"
            screenshot(browser, f"{url}#{PAGES[page]}", target, args.size, args.wait_ms)
            print(f"tb_screenshot: wrote {target}")
    except RuntimeError as err:
        print(f"tb_screenshot: {err}", file=sys.stderr)
        return 1
    finally:
        tensorboard.terminate()
        try:
            tensorboard.wait(timeout=10)
        except subprocess.TimeoutExpired:
            tensorboard.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
