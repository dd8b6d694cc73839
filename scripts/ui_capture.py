"""Capture a Prefect run page with headless Chromium, optionally with the run graph's subflows expanded.

    python scripts/ui_capture.py URL OUT.png [--size 1600x1000] [--wait 10] [--expand-subflows]
                                 [--colors 256] [--browser chromium]

Drives Chromium over the DevTools protocol (``websockets``, a Prefect dependency): open the page, let
the single-page app load, then, with ``--expand-subflows``, click the expand chevron of every subflow
bar in the run graph (found in captures: wide state-coloured bars with a white "v" at their left end),
pass after pass since an expanded group shows its own subflow bar, on a taller graph panel, then recenter
the graph and capture. ``--colors N`` writes an N-colour palette PNG (small files for docs). Offline: only the local UI is loaded.
Used by scripts/screenshot.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets
from PIL import Image

BAR_MIN_WIDTH = 60  # px: subflow bars are long, task bars of the film's quick steps are short
CHEVRON_SPAN = 40  # px from a bar's left end where its expand chevron sits


# The classic UI's run graph (a canvas inside .run-graph): make its panel taller, read its box, recenter it.
GROW_GRAPH = """
for (const sel of ['.flow-run-graphs', '.flow-run-graphs__graph-panel-container', '.flow-run-graphs__graphs',
                   '.flow-run-graph', '.run-graph']) {
  for (const el of document.querySelectorAll(sel)) { el.style.height = 'HEIGHTpx'; el.style.maxHeight = 'none'; }
}
window.dispatchEvent(new Event('resize'));
"""
STAGE_RECT = "JSON.stringify(document.querySelector('.run-graph__stage').getBoundingClientRect())"
RECENTER = "document.querySelector('button[title^=\"Recenter graph\"]').click()"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _saturated(px: tuple[int, int, int]) -> bool:
    return max(px) - min(px) > 60


def find_subflow_chevrons(png: bytes, region: tuple[int, int, int, int]) -> list[tuple[int, int]]:
    """Click points of the expand chevrons of wide bars inside ``region`` (x0, y0, x1, y1) of a capture.

    A bar is a block of rows holding a run of state-coloured (saturated) pixels at least
    ``BAR_MIN_WIDTH`` wide; its chevron is the white pixels near the bar's left end.
    """
    im = Image.open(io.BytesIO(png)).convert("RGB")
    x0, y0, x1, y1 = region
    rows: dict[int, tuple[int, int]] = {}
    for y in range(y0, min(y1, im.height)):
        best, start = (0, 0), None
        for x in range(x0, min(x1, im.width)):
            if _saturated(im.getpixel((x, y))):
                start = x if start is None else start
                if x - start + 1 > best[1] - best[0]:
                    best = (start, x + 1)
            else:
                start = None
        if best[1] - best[0] >= BAR_MIN_WIDTH:
            rows[y] = best
    bars, current = [], []
    for y in sorted(rows):
        if current and y != current[-1] + 1:
            bars.append(current)
            current = []
        current.append(y)
    if current:
        bars.append(current)
    points = []
    for ys in bars:
        left = min(rows[y][0] for y in ys)
        white = [
            (x, y)
            for y in ys
            for x in range(max(0, left - 8), left + CHEVRON_SPAN)
            if min(im.getpixel((x, y))) > 225
        ]
        if len(ys) >= 10 and white and _points_down(white):
            points.append((sum(x for x, _ in white) // len(white), sum(y for _, y in white) // len(white)))
    return points


def _points_down(white: list[tuple[int, int]]) -> bool:
    """A collapsed bar's chevron is a "v": its top rows are wider than its bottom rows (an expanded
    bar shows a "^")."""
    top, bottom = min(y for _, y in white), max(y for _, y in white)
    third = max(1, (bottom - top + 1) // 3)

    def spread(rows: range) -> int:
        xs = [x for x, y in white if y in rows]
        return max(xs) - min(xs) if xs else 0

    return spread(range(top, top + third)) > spread(range(bottom - third + 1, bottom + 1))


class Page:
    """The smallest DevTools client: numbered commands over one page's websocket."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    async def send(self, method: str, **params: object) -> dict:
        self.next_id += 1
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def click(self, x: int, y: int) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    async def capture(self) -> bytes:
        return base64.b64decode((await self.send("Page.captureScreenshot", format="png"))["data"])


async def _drive(port: int, url: str, out: Path, size: tuple[int, int], wait_s: float, expand: bool) -> None:
    deadline = time.monotonic() + 30
    targets: list[dict] = []
    while time.monotonic() < deadline and not targets:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as resp,
        ):
            targets = [t for t in json.load(resp) if t.get("type") == "page"]
        if not targets:
            await asyncio.sleep(0.3)
    if not targets:
        raise RuntimeError("chromium exposed no page to drive")
    async with websockets.connect(targets[0]["webSocketDebuggerUrl"], max_size=64 << 20) as ws:
        page = Page(ws)
        await page.send("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1],
                        deviceScaleFactor=1, mobile=False)  # fmt: skip
        await page.send("Page.navigate", url=url)
        await asyncio.sleep(wait_s)
        if expand:
            await page.send(
                "Runtime.evaluate", expression=GROW_GRAPH.replace("HEIGHT", str(int(0.78 * size[1])))
            )
            await asyncio.sleep(2.0)
            total = 0
            for _ in range(4):  # a subflow's own subflows appear once it is expanded
                stage = json.loads(
                    (await page.send("Runtime.evaluate", expression=STAGE_RECT, returnByValue=True))[
                        "result"
                    ]["value"]
                )
                region = (
                    int(stage["left"]),
                    int(stage["top"]) + 30,
                    int(stage["right"]) - 10,
                    int(stage["bottom"]) - 60,
                )
                points = find_subflow_chevrons(await page.capture(), region)
                if not points:
                    break
                for x, y in sorted(points, key=lambda p: -p[1]):  # bottom-up: rows above do not move
                    await page.click(x, y)
                    await asyncio.sleep(1.5)
                total += len(points)
                await asyncio.sleep(2.0)
            await page.send("Runtime.evaluate", expression=RECENTER)
            sys.stderr.write(f"ui_capture: expanded {total} subflow bar(s)\n")
            await asyncio.sleep(3.0)
        png = await page.capture()
        out.write_bytes(png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="1600x1000")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds for the app to load")
    parser.add_argument("--expand-subflows", action="store_true")
    parser.add_argument("--colors", type=int, default=0, help="palette size of the PNG (0: full colour)")
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    port = _free_port()
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen(
            [args.browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--hide-scrollbars", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             f"--remote-debugging-port={port}", f"--window-size={size[0]},{size[1]}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            asyncio.run(_drive(port, args.url, args.out, size, args.wait, args.expand_subflows))
            if args.colors:
                Image.open(args.out).convert("RGB").quantize(args.colors).save(args.out, optimize=True)
        finally:
            browser.terminate()
            try:
                browser.wait(10)
            except subprocess.TimeoutExpired:
                browser.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
