"""Measure what a newcomer waits for: ``python app.py`` to the first streamed token and to the
first finished race, and idle CPU.

    python scripts/first_start.py first-token [--cold] [--runs N]   # headless Chromium sends at once
    python scripts/first_start.py idle [--wait S] [--span S]         # CPU of an idle app.py
    (either with --root DIR: measure another checkout's app.py the same way)

``first-token`` starts ``python app.py --no-browser``, opens the page in headless Chromium as soon
as the server answers, types a prompt and presses Send at once (the worst case for the preload:
nothing overlaps with reading), and reports seconds from the start of ``python app.py`` to the
first token in the plain pane, then to the end of that race (the speculative pane done).
``--cold`` uses an empty temporary ``SPECDEMO_CACHE`` (the built-in model is converted first);
warm runs use the normal cache. ``idle`` starts the app with
nobody connected, waits until it printed that it is ready (or ``--wait`` seconds), then reads the
process's CPU time (psutil, children included) over ``--span`` seconds. Machine load (1-minute
load average) is printed with every number, and first-token runs also print the CPU seconds the
app used until then: on a shared machine, read those and ratios, not wall-clock absolutes.
``steps`` lists each start-up step the app printed with its estimate and the seconds it took
(``estimate_s``: "about N s" read as N, "under a second" as 1; ``ratio``: taken / estimate).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP_ROOT = [ROOT]  # --root changes it
PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog by the river."
FIRST_TOKEN_JS = ("return [...document.querySelectorAll('#plain-chat .sd-tokens')]"
                  ".some(e => e.textContent.trim().length > 0)")
RACE_STATE_JS = ("const c = document.querySelector('#spec-stats .sd-counters');"
                 "return c ? c.dataset.status : null")
FINISHED = ("done", "error", "stopped", "skipped")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         "--disable-sync", "--window-size=1500,1250")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def start_app(port: int, cache: str | None, log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    if cache:
        env["SPECDEMO_CACHE"] = cache
    return subprocess.Popen([sys.executable, "app.py", "--no-browser", "--port", str(port)],
                            cwd=APP_ROOT[0], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children: the work done, which a busy
    machine does not inflate the way it inflates wall time."""
    import psutil
    proc = psutil.Process(pid)
    times = [proc.cpu_times()] + [c.cpu_times() for c in proc.children(recursive=True)]
    return sum(t.user + t.system for t in times)


STEP_START = re.compile(r"^… (?P<name>.+?)(?: \((?P<about>under a second|about (?P<n>\d+) (?P<unit>s|min))\))?$")
STEP_END = re.compile(r"^[✓✗] (?P<name>.+): (?P<s>[\d.]+) s$")


def steps(log_text: str) -> list[dict]:
    """The start-up steps of an app log, in order: name, estimate_s (None when none was
    given), seconds, ratio (seconds / estimate_s)."""
    estimates, out = {}, []
    for line in log_text.splitlines():
        if m := STEP_START.match(line.strip()):
            n = m["n"]
            estimates[m["name"]] = (None if not m["about"] else 1.0 if n is None
                                    else float(n) * (60 if m["unit"] == "min" else 1))
        elif m := STEP_END.match(line.strip()):
            estimate, seconds = estimates.get(m["name"]), float(m["s"])
            out.append({"step": m["name"], "estimate_s": estimate, "seconds": seconds,
                        "ratio": round(seconds / estimate, 2) if estimate else None})
    return out


def first_token_s(cold: bool, log: Path) -> dict:
    """One run: seconds from starting app.py to server up, page ready, Send, first token."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=options)  # started before the clock: a user's browser is open
    cache = tempfile.mkdtemp(prefix="specdemo-cold-") if cold else None
    port, marks = free_port(), {"load_1min": os.getloadavg()[0]}
    start = time.monotonic()
    app = start_app(port, cache, log)
    try:
        while not answers(port):
            if app.poll() is not None:
                raise RuntimeError(f"app.py exited: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        marks["server_up_s"] = time.monotonic() - start
        driver.get(f"http://127.0.0.1:{port}/")
        while not driver.find_elements(By.CSS_SELECTOR, "#prompt textarea"):
            time.sleep(0.1)
        marks["page_ready_s"] = time.monotonic() - start
        driver.find_element(By.CSS_SELECTOR, "#prompt textarea").send_keys(PROMPT)
        driver.find_element(By.CSS_SELECTOR, "#send").click()
        marks["sent_s"] = time.monotonic() - start
        progress = False
        while True:
            progress = progress or bool(driver.find_elements(
                By.CSS_SELECTOR, "#startup progress, #plain-stats progress"))
            if driver.execute_script(FIRST_TOKEN_JS):
                break
            time.sleep(0.1)
        marks["first_token_s"] = time.monotonic() - start
        marks["app_cpu_s_until_first_token"] = cpu_seconds(app.pid)
        marks["progress_seen_before_first_token"] = progress
        while (state := driver.execute_script(RACE_STATE_JS)) not in FINISHED:
            time.sleep(0.1)
        marks["race_done_s"] = time.monotonic() - start
        marks["race_state"] = state
        marks["app_cpu_s_until_race_done"] = cpu_seconds(app.pid)
        marks["load_1min_after"] = os.getloadavg()[0]
    finally:
        driver.quit()
        app.terminate()
        app.wait(timeout=60)
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    marks = {k: round(v, 1) if isinstance(v, float) else v for k, v in marks.items()}
    return marks | {"steps": steps(log.read_text())}


def idle_cpu(wait_s: float, span_s: float, log: Path) -> dict:
    """Share of one core the app uses while idle, nobody connected."""
    app = start_app(free_port(), None, log)
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and "ready: send a prompt" not in log.read_text():
            time.sleep(1)
        time.sleep(5)  # let the last step's threads settle
        load, before, t0 = os.getloadavg()[0], cpu_seconds(app.pid), time.monotonic()
        time.sleep(span_s)
        used, elapsed = cpu_seconds(app.pid) - before, time.monotonic() - t0
    finally:
        app.terminate()
        app.wait(timeout=60)
    return {"idle_cpu_percent_of_one_core": round(100 * used / elapsed, 2), "span_s": round(elapsed, 1),
            "cpu_s": round(used, 2), "load_1min": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    first = sub.add_parser("first-token")
    first.add_argument("--cold", action="store_true", help="empty temporary SPECDEMO_CACHE")
    first.add_argument("--runs", type=int, default=1)
    idle = sub.add_parser("idle")
    idle.add_argument("--wait", type=float, default=300, help="seconds to wait for 'ready' at most")
    idle.add_argument("--span", type=float, default=60, help="seconds to measure over")
    for command in (first, idle):
        command.add_argument("--root", type=Path, default=ROOT, help="checkout whose app.py runs")
    args = parser.parse_args()
    APP_ROOT[0] = args.root
    log = Path(tempfile.mkdtemp(prefix="specdemo-measure-")) / "app.log"
    if args.what == "first-token":
        for _ in range(args.runs):
            print(json.dumps({"cold": args.cold, **first_token_s(args.cold, log)}), flush=True)
    else:
        print(json.dumps(idle_cpu(args.wait, args.span, log)), flush=True)


if __name__ == "__main__":
    main()
