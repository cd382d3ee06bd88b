"""A real browser on the real page: headless Debian Chromium driven by selenium.

Types a prompt, clicks Send, waits for both panes, checks the counters and the highlight legend,
replays the race and saves a screenshot (its path is printed; run pytest with -s to see it).
"""

import os
import re
import shutil
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
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from specdemo import ui  # noqa: E402
from test_ui import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "screenshots" / "race.png"
PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog by the river."
MAX_NEW_TOKENS = 32
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         "--disable-sync", "--window-size=1500,1250")


@pytest.fixture(scope="module")
def page():
    port = free_port()
    demo = ui.build_ui()
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER if Path(CHROMEDRIVER).exists()
                                              else shutil.which("chromedriver")), options=options)
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
    assert re.fullmatch(r"[0-4]", metric(page, "spec", "draft_length"))  # 0: a round with no match
    assert re.fullmatch(r"\d+%|–", metric(page, "spec", "acceptance_rate"))

    # Highlighting: one marked span per accepted draft token, a legend, the lossless badge.
    assert len(page.find_elements(By.CSS_SELECTOR, "#spec-chat .sd-tok.sd-draft")) == accepted
    marked = page.find_elements(By.CSS_SELECTOR, "#spec-chat .sd-tok")
    assert len(marked) == plain_tokens
    assert css(page, "#sd-legend").is_displayed()
    assert "accepted draft token" in css(page, "#sd-legend").text
    assert css(page, "#race-verdict .sd-lossless").is_displayed()
    assert "speedup" in css(page, "#race-verdict").text
    assert css(page, "#sd-privacy").is_displayed()
    assert "plain" in css(page, "#plain-chat").text.lower() or css(page, "#plain-chat").text

    # The draft dropdown's check: a different-tokenizer built-in is refused, with the reason.
    refused = WebDriverWait(page, 180).until(
        lambda d: "Drafts offered" in css(d, "#draft-refused").text and css(d, "#draft-refused"))
    assert "builtin:gemma3-270m" in refused.text and "different tokenizers" in refused.text

    SCREENSHOT.parent.mkdir(exist_ok=True)
    for _ in range(3):  # the whole page, privacy line too (resizing reflows it)
        height = page.execute_script("return document.documentElement.scrollHeight")
        page.set_window_size(1500, min(max(height + 150, 1250), 4000))
    page.save_screenshot(str(SCREENSHOT))
    print(f"\nscreenshot: {SCREENSHOT}")

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
