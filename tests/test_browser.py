"""A real browser on the real page: headless Debian Chromium driven by selenium.

Types a prompt, clicks Send, waits for both panes, checks the counters and the highlight legend,
replays the race and saves a screenshot (its path is printed; run pytest with -s to see it).
A second test starts ``python app.py`` on an empty model cache (the built-in model is converted
first, ~30-60 s here) and checks that the page shows what it is doing before the first token.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
if not (Path(CHROMIUM).exists() or shutil.which("chromium")) or not (
        Path(CHROMEDRIVER).exists() or shutil.which("chromedriver")):
    pytest.skip("Chromium and chromedriver are not installed (apt-get install chromium "
                "chromium-driver)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from specdemo.interfaces import ui  # noqa: E402
from test_ui import answers, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "screenshots" / "race.png"
COLD_SCREENSHOTS = ROOT / "screenshots" / "cold-start-progress.png", ROOT / "screenshots" / "cold-start.png"
HUMAN_LABELS = ("Tokens/s", "Time to first token", "Acceptance", "Mean acceptance length",
                "Drafted / accepted", "Extra memory")
PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog by the river."
MAX_NEW_TOKENS = 32
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         "--disable-sync", "--window-size=1500,1250")


def chromium():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER if Path(CHROMEDRIVER).exists()
                                            else shutil.which("chromedriver")), options=options)


def whole_page_screenshot(driver, path: Path) -> None:
    path.parent.mkdir(exist_ok=True)
    for _ in range(3):  # the whole page, privacy line too (resizing reflows it)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1500, min(max(height + 150, 1250), 4000))
    driver.save_screenshot(str(path))
    print(f"\nscreenshot: {path}")


@pytest.fixture(scope="module")
def page():
    port = free_port()
    demo = ui.build_ui()
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    driver = chromium()
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        yield driver
    finally:
        driver.quit()
        demo.close()


def css(driver, selector):
    return driver.find_element(By.CSS_SELECTOR, selector)


def metric(driver, pane, name):
    return css(driver, f"#{pane}-stats [data-metric='{name}']").text


def status(driver, pane):
    return css(driver, f"#{pane}-stats .sd-status").text


def test_race_in_the_browser(page):
    wait = WebDriverWait(page, 60)
    box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea"))
    # Fewer new tokens so the race is quick: type into the slider's number box.
    number = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#max-new-tokens input[type='number']"))
    number.send_keys(Keys.CONTROL, "a")
    number.send_keys(str(MAX_NEW_TOKENS), Keys.TAB)
    # A fixed draft length, so prompt lookup drafts on every round (auto may fall back to plain).
    k = css(page, "#draft-length input")
    k.click()
    k.send_keys(Keys.CONTROL, "a")
    k.send_keys("4", Keys.ENTER)
    box.send_keys(PROMPT)
    css(page, "#send").click()

    WebDriverWait(page, 300).until(
        lambda d: status(d, "plain").startswith("done") and status(d, "spec").startswith("done"))

    # Counters are shown and consistent between the panes (temperature 0: the same tokens).
    plain_tokens = int(metric(page, "plain", "new_tokens"))
    assert 1 <= plain_tokens <= MAX_NEW_TOKENS
    assert int(metric(page, "spec", "new_tokens")) == plain_tokens
    for pane in ("plain", "spec"):
        assert re.fullmatch(r"\d+\.\d", metric(page, pane, "tokens_per_s"))
        assert re.fullmatch(r"\d+\.\d\d s", metric(page, pane, "ttft_s"))
    drafted, accepted = (int(x) for x in metric(page, "spec", "drafted / accepted").split(" / "))
    assert 0 < accepted <= drafted  # the answer copies the prompt: prompt lookup gets accepted
    # k = 4, or (when prompt lookup found fewer tokens in some rounds) the mean and range used
    assert re.fullmatch(r"4( · mean \d\.\d \([0-4]–4\))?", metric(page, "spec", "draft_length"))
    assert re.fullmatch(r"\d+%|–", metric(page, "spec", "acceptance_rate"))

    # Highlighting: one marked span per accepted draft token, a legend, the lossless badge.
    assert len(page.find_elements(By.CSS_SELECTOR, "#spec-chat .sd-tok.sd-draft")) == accepted
    marked = page.find_elements(By.CSS_SELECTOR, "#spec-chat .sd-tok")
    assert len(marked) == plain_tokens
    assert css(page, "#sd-legend").is_displayed()
    assert "accepted draft token" in css(page, "#sd-legend").text
    assert css(page, "#race-verdict .sd-lossless").is_displayed()
    assert "speedup" in css(page, "#race-verdict").text.lower()
    assert css(page, "#sd-privacy").is_displayed()
    assert "plain" in css(page, "#plain-chat").text.lower() or css(page, "#plain-chat").text

    # The draft dropdown's check: a different-tokenizer built-in is refused, with the reason.
    refused = WebDriverWait(page, 180).until(
        lambda d: "Drafts offered" in css(d, "#draft-refused").text and css(d, "#draft-refused"))
    assert "builtin:gemma3-270m" in refused.text and "different tokenizers" in refused.text

    whole_page_screenshot(page, SCREENSHOT)

    # Replay: both panes play back and end where the race ended.
    css(page, "#replay").click()
    WebDriverWait(page, 60).until(lambda d: "replay" in css(d, "#race-verdict").text)
    WebDriverWait(page, 120).until(lambda d: css(d, "#race-verdict .sd-lossless"))
    assert int(metric(page, "spec", "new_tokens")) == plain_tokens

    # Nothing was fetched from anywhere but this machine.
    urls = page.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith("http://127.0.0.1:") or u.startswith("data:") for u in urls), \
        [u for u in urls if not u.startswith("http://127.0.0.1:")]


def test_ready_after_the_draft_checks_and_the_models_line_follows_the_draft(page):
    """Issue 20.7 and 20.9: "Ready" only once the draft checks have run (a Send then starts at
    once instead of showing "loading the model…" behind a check); the default draft's name fits
    its box; picking another draft names it in the "Models:" line at once."""
    ui._VERDICTS.clear()  # the draft checks run again for this page
    page.get(page.current_url)
    seen = []

    def ready(d):
        state, refused = d.execute_script(
            "const s = document.querySelector('#startup .sd-startup');"
            "const r = document.querySelector('#draft-refused');"
            "return [s && s.dataset.state, r && r.textContent];")
        seen.append(state)
        return state == "ready" and refused

    refused = WebDriverWait(page, 600, poll_frequency=0.1).until(ready)
    assert "Drafts offered" in refused, (refused, seen)
    # issue 20.11: the empty race chart's ticks read "0", not "0.000000"
    ticks = page.execute_script(
        "return [...document.querySelectorAll('#race-chart svg text')].map(t => t.textContent)")
    assert "0" in ticks and not any("0.000" in t for t in ticks), ticks
    box = css(page, "#draft input")
    fits = page.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", box)
    assert fits, (box.get_attribute("value"), box.size,
                  page.execute_script("return arguments[0].scrollWidth", box))

    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("self")

    def pick(d):  # the list is redrawn while it filters: find and click in one go, retry if stale
        try:
            option = next(o for o in d.find_elements(By.CSS_SELECTOR, "#draft li")
                          if o.text.strip() == "self")
            option.click()
            return True
        except (StopIteration, StaleElementReferenceException):
            return False
    WebDriverWait(page, 20).until(pick)
    WebDriverWait(page, 30).until(
        lambda d: "; draft self not loaded yet." in " ".join(css(d, "#model-status").text.split()))


def lines_drawn(driver, chart_id: str) -> int:
    """Lines with at least one segment in a gradio native (Vega, SVG) line chart."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' g.mark-line path')].filter("
        "p => (p.getAttribute('d') || '').includes('L')).length", f"#{chart_id}")


@pytest.mark.slow
def test_cold_start_explains_itself_then_races(tmp_path):
    """Issue 12: on an empty cache, ``python app.py`` converts the built-in model; the page shows
    the step with a progress bar and an estimate before the first token, then the race as a
    chart, with counters labelled for people."""
    port = free_port()
    env = dict(os.environ, SPECDEMO_CACHE=str(tmp_path / "cache"), GRADIO_ANALYTICS_ENABLED="False")
    log = open(tmp_path / "app.log", "w")
    app = subprocess.Popen([sys.executable, "app.py", "--no-browser", "--port", str(port)],
                           cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    driver = chromium()
    try:
        deadline = time.monotonic() + 300
        while not answers("127.0.0.1", port):
            assert app.poll() is None and time.monotonic() < deadline, (tmp_path / "app.log").read_text()
            time.sleep(0.3)
        driver.get(f"http://127.0.0.1:{port}/")
        box = WebDriverWait(driver, 120).until(lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea"))
        number = WebDriverWait(driver, 120).until(  # the page may still be drawing its controls
            lambda d: d.find_element(By.CSS_SELECTOR, "#max-new-tokens input[type='number']"))
        number.send_keys(Keys.CONTROL, "a")
        number.send_keys(str(MAX_NEW_TOKENS), Keys.TAB)
        box.send_keys(PROMPT)
        css(driver, "#send").click()  # at once: the models are still being prepared

        COLD_SCREENSHOTS[0].parent.mkdir(exist_ok=True)
        steps_seen, first_token, deadline = set(), False, time.monotonic() + 600
        while not first_token:
            assert time.monotonic() < deadline and app.poll() is None
            for bar in driver.find_elements(By.CSS_SELECTOR, "#startup .sd-step, #plain-stats .sd-step"):
                try:
                    step = bar.get_attribute("data-step")
                except Exception:  # the element was redrawn meanwhile
                    continue
                if "converting" in step and "converting" not in " ".join(steps_seen):
                    driver.execute_script("window.scrollTo(0, 0)")  # the progress is at the top
                    driver.save_screenshot(str(COLD_SCREENSHOTS[0]))
                steps_seen.add(step)
            first_token = driver.execute_script(
                "return [...document.querySelectorAll('#plain-chat .sd-tokens')]"
                ".some(e => e.textContent.trim().length > 0)")
            time.sleep(0.2)
        # the progress bar was there before the first token, naming the conversion and the load
        assert any(s.startswith("locating and converting builtin:smollm2-135m's weights (once")
                   for s in steps_seen), steps_seen
        assert "loading builtin:smollm2-135m" in steps_seen, steps_seen

        WebDriverWait(driver, 600).until(
            lambda d: status(d, "plain").startswith("done") and status(d, "spec").startswith("done"))
        labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#spec-stats .sd-label")]
        assert all(label in labels for label in HUMAN_LABELS), labels
        cell = css(driver, "#spec-stats [data-metric='tokens_per_s']").find_element(By.XPATH, "..")
        assert cell.get_attribute("title").startswith("tokens_per_s:")
        assert css(driver, "#spec-stats [data-metric='draft_length']").text.startswith("auto")
        WebDriverWait(driver, 30).until(lambda d: lines_drawn(d, "race-chart") == 2)
        assert css(driver, "#race-chart").text.count("The race: tokens generated over time") == 1
        assert "acceptance per draft position" in css(driver, "#acceptance-chart").text.lower()
        WebDriverWait(driver, 120).until(
            lambda d: 'data-state="ready"' in css(d, "#startup").get_attribute("innerHTML"))
        whole_page_screenshot(driver, COLD_SCREENSHOTS[1])
        # the same steps were printed on the command line
        printed = (tmp_path / "app.log").read_text()
        assert "… locating and converting builtin:smollm2-135m's weights (once; not converted yet)" in printed
        assert "✓ loading builtin:smollm2-135m: " in printed
    finally:
        driver.quit()
        app.terminate()
        app.wait(timeout=60)
        log.close()
