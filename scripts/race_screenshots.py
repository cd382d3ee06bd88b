"""The page after a race at a fixed draft length and after one at ``auto``, as screenshots.

Starts the app on the default preset with the app's settings built from these flags (an
``AppSettings`` passed to the preload and the page as app.py passes it; ``--backend`` as app.py's,
default ``auto``), opens it in headless Chromium (Debian's
``chromium`` and ``chromedriver``, as tests/test_browser.py), races one prompt at ``--fixed`` (k = 4
by default: on a 2-core CPU a chat prompt then usually loses), clears the conversation, races it
again at ``auto``, and saves the page after each, with the speedup and the line under it that
explains the race (docs/reference.md, "Why a race won or lost"). Prints each explanation line.

    python scripts/race_screenshots.py [--out docs/results] [--fixed 4] [--prompt TEXT] [--backend auto]
        [--page docs/race.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from first_start import FLAGS, free_port  # noqa: E402  (this folder: the same browser flags)
PROMPT = ("Write a short note to my neighbour asking them to water my plants while I am away "
          "next week.")


def missing_tools() -> str | None:
    """One sentence naming what this script needs and this machine lacks (Chromium,
    chromedriver, the selenium package) and how to install it, or None when all are there."""
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        return "needs Chromium and chromedriver (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401  (only whether it is installed)
    except ImportError:
        return ("needs the selenium package, which only the test set-up installs: run "
                "scripts/setup.sh test (or pip install selenium)")
    return None


def settings_of(args: argparse.Namespace):
    """The app's settings for this run (the default preset, ``--backend``), as app.py builds
    them from its flags."""
    from specdemo.interfaces.ui_state import AppSettings
    return AppSettings(backend=args.backend)


def main(argv: list[str] | None = None) -> int:
    from specdemo.core import BACKENDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"), help="folder for the two PNGs")
    parser.add_argument("--fixed", default="4", help="the fixed draft length of the first race (default 4)")
    parser.add_argument("--prompt", default=PROMPT, help="the prompt both races send (default: a chat note)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--page", default=None, help="also save the whole page after the auto race "
                        "here (the README's picture is docs/race.png)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="the targets' forward backend, as app.py's --backend (default %(default)s)")
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from specdemo.interfaces import ui, ui_state

    app = settings_of(args)  # passed down as app.py passes its settings
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    preset = ui_state._default_preset_name(None, app)
    if not ui_state.start_preload(preset, app).wait(1800) or ui_state._PRELOAD["error"]:
        print(f"the preload did not finish: {ui_state._PRELOAD['error']}", file=sys.stderr)
        return 2
    print(f"backend {app.backend}: {ui_state.loaded_backend(preset)}")
    port = free_port()
    demo = ui.build_ui(app)
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_window_size(1500, 1000)  # the verdict and charts in one screen
    css = driver.find_element

    def status(pane: str) -> str:
        return css(By.CSS_SELECTOR, f"#{pane}-stats .sd-status").text

    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait = WebDriverWait(driver, 120)
        box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea"))
        number = css(By.CSS_SELECTOR, "#max-new-tokens input[type='number']")
        number.send_keys(Keys.CONTROL, "a")
        number.send_keys(str(args.max_new_tokens), Keys.TAB)
        for k, name in ((args.fixed, f"race-explanation-k{args.fixed}.png"), ("auto", "race-explanation-auto.png")):
            field = css(By.CSS_SELECTOR, "#draft-length input")
            field.click()
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(k, Keys.ENTER)
            css(By.CSS_SELECTOR, "#clear").click()
            WebDriverWait(driver, 30).until(lambda d: not status("spec").startswith("done"))
            box = css(By.CSS_SELECTOR, "#prompt textarea")
            box.send_keys(args.prompt)
            css(By.CSS_SELECTOR, "#send").click()
            WebDriverWait(driver, 600).until(
                lambda d: status("plain").startswith("done") and status("spec").startswith("done")
                and "Speedup" in css(By.CSS_SELECTOR, "#race-verdict").text)
            verdict = css(By.CSS_SELECTOR, "#race-verdict")
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", verdict)
            driver.save_screenshot(str(out / name))
            print(f"k = {k}: {verdict.text}\n  -> {out / name}")
        if args.page:
            driver.execute_script("window.scrollTo(0, 0);")
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1500, min(height, 1700))
            driver.execute_script("window.scrollTo(0, 0);")
            driver.save_screenshot(args.page)
            print(f"the page -> {args.page}")
    finally:
        driver.quit()
        demo.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
