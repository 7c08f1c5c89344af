"""Screenshots of the Prefect UI after a real ``pipeline`` flow run, for docs/ui.md.

What it does, end to end and on this machine only (loopback, free ports):

1. finds a Chromium binary, else ``apt-get install -y chromium`` (Debian; exits 2 if that fails);
2. starts a real PostgreSQL (``PostgresServer``) and a real Prefect server on it (``PrefectServer``),
   or on SQLite with ``--no-postgres``;
3. runs the ``pipeline`` flow against that server in a subprocess whose environment is the server's
   client environment plus ``TUNEFLEET_HOME=<temp dir>`` (tunefleet's embedded SQLite and local
   artifacts) and ``PREFECT_LOGGING_EXTRA_LOGGERS=tunefleet`` (tunefleet's logs reach the UI);
4. screenshots the flow run page ``/runs/flow-run/<id>`` and the runs list ``/runs`` with headless
   Chromium (flags from RECIPES: without ``--virtual-time-budget`` the page is still blank), once
   per budget in ``--budget-ms``, and keeps the most detailed picture of each (see
   ``best_screenshot``);
5. checks each page reached the API and shows the run (a ``--dump-dom`` of the same page) and each
   PNG is not blank (size and number of distinct colours), prints the paths and the flow run's
   final state, then stops both servers.

Usage::

    python docs/ui_screenshot.py                       # docs/img/flow-run.png, docs/img/flow-runs.png
    python docs/ui_screenshot.py --model mlp --trials 4 --no-postgres

Exit status: 0 when both pictures were taken and the flow run completed, 1 when a picture looks
blank or the flow run did not complete, 2 when no Chromium could be found or installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
MIN_BYTES = 20_000
MIN_COLOURS = 32

# Runs inside the flow subprocess: argv[1] is the JSON of the flow's parameters.
FLOW_CODE = """
import json, sys
from tunefleet.flows.pipeline import pipeline
state = pipeline(**json.loads(sys.argv[1]), return_state=True)
print("TUNEFLEET_FLOW_RUN_ID=" + str(state.state_details.flow_run_id), flush=True)
print("TUNEFLEET_FLOW_STATE=" + str(state.name), flush=True)
"""


def log(msg: str) -> None:
    print(f"[ui_screenshot] {msg}", flush=True)


# -- 1. Chromium ------------------------------------------------------------------------------------
def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env and Path(env).exists():
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium() -> str:
    path = find_chromium()
    if path:
        log(f"chromium: {path}")
        return path
    apt = shutil.which("apt-get")
    if apt is None:
        print("error: no chromium binary found and no apt-get to install it (set CHROMIUM=/path/to/chromium)",
              file=sys.stderr)
        sys.exit(2)
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    install = [*sudo, "nice", "-n", "19", apt, "install", "-y", "--no-install-recommends", "chromium"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    update = [*sudo, "nice", "-n", "19", apt, "update"]
    log("no chromium binary found; installing Debian's chromium")
    for retry in (False, True):
        if retry:  # the package lists may be stale: update them once, then try again
            log(f"install failed; running: {' '.join(update)}")
            subprocess.run(update, env=env, check=False)
        log(f"running: {' '.join(install)}")
        if subprocess.run(install, env=env, check=False).returncode == 0:
            path = find_chromium()
            if path:
                log(f"chromium installed: {path}")
                return path
    print("error: chromium is not installed and `apt-get install -y chromium` failed "
          "(install Debian's chromium or set CHROMIUM=/path/to/chromium)", file=sys.stderr)
    sys.exit(2)


# -- 4. screenshots ---------------------------------------------------------------------------------
def screenshot(chromium: str, url: str, out: Path, *, width: int, height: int, budget_ms: int) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    with tempfile.TemporaryDirectory(prefix="tunefleet-chromium-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
               f"--window-size={width},{height}", f"--screenshot={out}", url]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if res.returncode != 0 or not out.exists():
        raise RuntimeError(f"chromium failed ({res.returncode}): {res.stderr[-2000:]}")


def best_screenshot(chromium: str, url: str, out: Path, *, width: int, height: int, budgets: list[int]) -> int:
    """Take one screenshot per virtual-time budget, keep the one with the most colours; return its budget.

    The UI's timing under virtual time is not deterministic: the same budget sometimes catches the
    runs list half faded in (a loading overlay) or the graph's time axis with every label drawn
    on top of each other. Both have clearly fewer distinct colours than the finished page.
    """
    best: tuple[int, int] | None = None
    with tempfile.TemporaryDirectory(prefix="tunefleet-shots-") as tmp:
        for budget in budgets:
            shot = Path(tmp) / f"{budget}.png"
            screenshot(chromium, url, shot, width=width, height=height, budget_ms=budget)
            colours = count_colours(shot, limit=1_000_000)
            log(f"  budget {budget} ms: {shot.stat().st_size / 1024:.0f} KiB, {colours} colours")
            if best is None or colours > best[0]:
                best = (colours, budget)
        assert best is not None
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(tmp) / f"{best[1]}.png", out)
    log(f"kept {url} at budget {best[1]} ms -> {out}")
    return best[1]


def page_dom(chromium: str, url: str, *, width: int, height: int, budget_ms: int) -> str:
    """The page's DOM after the same virtual time as its screenshot (a second, independent load)."""
    with tempfile.TemporaryDirectory(prefix="tunefleet-chromium-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               f"--virtual-time-budget={budget_ms}", f"--window-size={width},{height}", "--dump-dom", url]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"chromium --dump-dom failed ({res.returncode}): {res.stderr[-2000:]}")
    return res.stdout


def check_dom(dom: str, url: str, must: list[str], pattern: str | None = None) -> None:
    """Raise unless the page reached the API and shows what it should."""
    if "connect to Server API" in dom:
        raise RuntimeError(f"{url}: the UI cannot reach the server's API")
    missing = [m for m in must if m not in dom]
    if pattern and not re.search(pattern, dom):
        missing.append(f"/{pattern}/")
    if missing:
        raise RuntimeError(f"{url}: the page does not show {', '.join(missing)} (still loading? raise --budget-ms)")


def check_ui_settings(server) -> None:  # type: ignore[no-untyped-def]
    """The UI must be told the server's own API URL (see ``ui_server_class``)."""
    with urllib.request.urlopen(f"{server.ui_url}/ui-settings", timeout=10) as resp:
        api_url = json.load(resp).get("api_url")
    if api_url != server.api_url:
        raise RuntimeError(f"the UI would call {api_url}, not {server.api_url}")


# -- 5. blank check (standard library; numpy is only used to go faster when it is there) -----------
def png_pixels(path: Path) -> tuple[int, int, int, bytes]:
    """Decode an 8-bit, non-interlaced RGB/RGBA/grey PNG: (width, height, bytes per pixel, raw pixels)."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat = 8, bytearray()
    width = height = bpp = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            if depth != 8 or interlace or colour not in (0, 2, 4, 6):
                raise ValueError(f"{path}: unsupported PNG (depth {depth}, colour {colour}, interlace {interlace})")
            bpp = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw = zlib.decompress(bytes(idat))
    stride = width * bpp
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return width, height, bpp, bytes(out)


def count_colours(path: Path, limit: int = 4096) -> int:
    """Distinct pixel values (capped at ``limit``)."""
    width, height, bpp, pixels = png_pixels(path)
    seen: set[bytes] = set()
    for i in range(0, len(pixels), bpp):
        seen.add(pixels[i:i + bpp])
        if len(seen) >= limit:
            break
    return len(seen)


def check_png(path: Path) -> str:
    """Raise if the picture looks blank; return a one-line description."""
    size = path.stat().st_size
    if size < MIN_BYTES:
        raise RuntimeError(f"{path}: only {size} bytes, the page looks blank")
    colours = count_colours(path)
    if colours < MIN_COLOURS:
        raise RuntimeError(f"{path}: only {colours} distinct colour(s), the page looks blank")
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return f"{path} ({width}x{height}, {size / 1024:.0f} KiB, {colours}{'+' if colours >= 4096 else ''} colours)"


# -- 2.-3. servers and the flow run ------------------------------------------------------------------
def run_flow(server, params: dict, home: Path, timeout_s: float) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    env = server.env(TUNEFLEET_HOME=str(home), PREFECT_LOGGING_EXTRA_LOGGERS="tunefleet")
    for key in [k for k in env if k.startswith("TUNEFLEET_") and k != "TUNEFLEET_HOME"]:
        env.pop(key)  # TUNEFLEET_DATABASE_URL etc. would point tunefleet elsewhere than its temp home
    cmd = [sys.executable, "-c", FLOW_CODE, json.dumps(params)]
    log(f"running the pipeline flow: {json.dumps(params)} (TUNEFLEET_HOME={home})")
    flow_log = home / "flow.log"
    with open(flow_log, "w") as fh:
        proc = subprocess.run(cmd, env=env, cwd=str(home), stdout=fh, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout_s, check=False)
    text = flow_log.read_text(errors="replace")
    values = dict(line.split("=", 1) for line in text.splitlines() if line.startswith("TUNEFLEET_FLOW_"))
    run_id, state = values.get("TUNEFLEET_FLOW_RUN_ID"), values.get("TUNEFLEET_FLOW_STATE")
    if not run_id:
        raise RuntimeError(f"the flow subprocess exited {proc.returncode} without a flow run id:\n{text[-4000:]}")
    return run_id, state or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs/img/flow-run.png", help="flow run page picture")
    ap.add_argument("--runs-out", type=Path, default=None,
                    help="runs list picture (default: flow-runs.png next to --out)")
    ap.add_argument("--model", action="append", dest="models", help="model to tune (repeatable; default mlp)")
    ap.add_argument("--hardware", default="x86", help="hardware class (default x86)")
    ap.add_argument("--trials", type=int, default=4, help="trials per workload (default 4)")
    ap.add_argument("--postgres", action=argparse.BooleanOptionalAction, default=True,
                    help="Prefect server on a real PostgreSQL (default) or on SQLite")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1200, help="flow run page height")
    ap.add_argument("--runs-height", type=int, default=1320, help="runs list height")
    ap.add_argument("--budget-ms", type=int, nargs="+", default=[10000, 15000, 20000, 30000],
                    help="Chromium --virtual-time-budget of each attempt; the most detailed picture is kept")
    ap.add_argument("--flow-timeout", type=float, default=1800.0, help="seconds the flow run may take")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    runs_out: Path = (args.runs_out or out.with_name("flow-runs.png")).resolve()
    params = {"models": args.models or ["mlp"], "hardware": [args.hardware], "trials": args.trials,
              "trials_per_iter": args.trials, "seed": 0}

    started = time.monotonic()
    chromium = ensure_chromium()

    from tunefleet.testing.postgres import PostgresServer
    from tunefleet.testing.prefect_server import PrefectServer

    pg = PostgresServer() if args.postgres else None
    server = None
    try:
        database_url = None
        if pg is not None:
            pg.start()
            database_url = pg.url(pg.create_database("prefect"), driver="asyncpg")
            log(f"PostgreSQL on 127.0.0.1:{pg.port}")
        server = PrefectServer(database_url).start()
        log(f"Prefect server {server.ui_url} ({'PostgreSQL' if pg else 'SQLite'})")
        with tempfile.TemporaryDirectory(prefix="tunefleet-home-") as tmp:
            home = Path(tmp)
            params["output_dir"] = str(home / "out")
            t0 = time.monotonic()
            run_id, state = run_flow(server, params, home, args.flow_timeout)
            log(f"flow run {run_id} ended {state} after {time.monotonic() - t0:.0f} s")
            check_ui_settings(server)
            pages = [(f"{server.ui_url}/runs/flow-run/{run_id}", out, args.height, ["pipeline", state], None),
                     (f"{server.ui_url}/runs", runs_out, args.runs_height, ["pipeline"], r"\b[1-9][0-9]* runs?\b")]
            problems = []
            for url, path, height, must, pattern in pages:
                budget = best_screenshot(chromium, url, path, width=args.width, height=height,
                                         budgets=args.budget_ms)
                try:
                    dom = page_dom(chromium, url, width=args.width, height=height, budget_ms=budget)
                    check_dom(dom, url, must, pattern)
                    print(f"picture: {check_png(path)}", flush=True)
                except RuntimeError as exc:
                    problems.append(str(exc))
        print(f"flow run {run_id}: {state}", flush=True)
        print(f"took {time.monotonic() - started:.0f} s", flush=True)
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1 if problems or state != "Completed" else 0
    except Exception:
        if server is not None and server.home is not None:
            print(f"--- prefect server log ---\n{server.log_tail()}", file=sys.stderr)
        raise
    finally:
        if server is not None:
            server.stop()
        if pg is not None:
            pg.stop()
        log("servers stopped")


if __name__ == "__main__":
    sys.exit(main())
