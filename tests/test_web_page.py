"""The web page at / in a real headless browser (Debian's chromium and chromium-driver, driven by
selenium) against `cobatch serve` in a child process: the page loads with no console errors, a
chat streams its answer into the page and its next turn hits the prefix cache, a JSON Schema
answer is shown formatted and marked valid, a conversation survives a restart, the live view
shows steps moving while a batch job runs to done, and with an API key the page asks for it and
shows no data. Skips, saying why, where no browser is installed.

With COBATCH_WEB_SCREENSHOT=PATH the mixed-run test also saves its screenshot there (docs/web.png)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.server_fixtures import serve_process, spawn_serve, wait_serving, wait_until as wait_for

pytestmark = pytest.mark.model

SERVE_ARGS = ("--n-ctx", "4096", "--max-running", "16")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def _browser_binaries() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install '.[test]')")
    binaries = _browser_binaries()
    if binaries is None:
        pytest.skip("no headless browser: install chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver), as .ci/run does")
    options = webdriver.ChromeOptions()
    options.binary_location = binaries[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(binaries[1]), options=options)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve_process(*SERVE_ARGS, "--data-dir", str(tmp_path_factory.mktemp("web-data"))) as (_, url):
        yield url


# ---- page helpers -------------------------------------------------------------------------------

def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def attributes(driver, selector: str, name: str) -> list[str | None]:
    """One attribute of every match, read in one script: the live view replaces its cards on every
    event, so a handle found a moment earlier may already be stale."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.getAttribute(arguments[1]))",
        selector, name)


def texts(driver, selector: str) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)", selector)


def open_page(driver, url: str) -> None:
    driver.get(url + "/")
    driver.get_log("browser")  # drop what an earlier page logged
    wait_for(lambda: by_id(driver, "model-name").text or by_id(driver, "key-prompt").is_displayed(), 60,
             "the page did not start")


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def set_field(driver, element_id: str, value: str) -> None:
    field = by_id(driver, element_id)
    driver.execute_script("arguments[0].value = arguments[1]", field, value)


def open_settings(driver) -> None:
    details = by_id(driver, "settings")
    if not details.get_attribute("open"):
        css(driver, "#settings summary")[0].click()


# The page re-renders an answer as it streams: read each one whole in one script, never through
# element handles that a re-render makes stale.
_ANSWERS = """
return [...document.querySelectorAll('#messages .message.assistant')].map((m) => ({
  text: m.querySelector('.text').textContent,
  json: m.querySelector('pre.json') !== null,
  stats: Object.fromEntries([...m.querySelectorAll('.stats > span')].map((s) => [s.className, s.textContent])),
}));
"""


def answers(driver) -> list[dict]:
    return driver.execute_script(_ANSWERS)


def send(driver, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    prompt = by_id(driver, "prompt")
    prompt.send_keys(text)
    prompt.send_keys(Keys.ENTER)


def finished_answer(driver, n: int, timeout: float = 120, also: str | None = None) -> dict:
    """The n-th answer (1-based) once its stats show how it finished (and the stat `also`)."""
    def done():
        shown = answers(driver)
        ok = len(shown) >= n and "finish" in shown[n - 1]["stats"] and (also is None or also in str(shown[n - 1]["stats"]))
        return ok and shown[n - 1]
    return wait_for(done, timeout, f"answer {n} did not finish")


def stat(answer: dict, name: str) -> str:
    return answer["stats"][name]


def number(text: str) -> float:
    return float(text.replace("ms", "").replace("tok/s", "").split()[-1].replace(",", ""))


def new_conversation(driver) -> None:
    by_id(driver, "new-conversation").click()
    wait_for(lambda: not css(driver, "#messages .message"), 10, "the conversation did not clear")


# ---- tests ----------------------------------------------------------------------------------------

def test_the_page_loads_and_every_view_runs_without_console_errors(browser, served):
    open_page(browser, served)
    assert by_id(browser, "model-name").text == "gemma-3-270m-Q4_K_M"
    assert not by_id(browser, "key-prompt").is_displayed()
    by_id(browser, "tab-engine").click()
    wait_for(lambda: int(by_id(browser, "engine-status").get_attribute("data-events") or 0) >= 3, 20,
             "the live view got no events")
    assert by_id(browser, "steps-chart").is_displayed()
    assert set(attributes(browser, "#engine-cards .card", "data-card")) >= {
        "running", "queued interactive", "queued batch", "decode threads", "KV blocks used / total"}
    by_id(browser, "tab-batches").click()
    assert by_id(browser, "upload-form").is_displayed() and not by_id(browser, "steps-chart").is_displayed()
    by_id(browser, "tab-chat").click()
    # A phone-width screen: nothing wider than the screen; and the system's dark mode is followed.
    browser.set_window_size(390, 844)
    try:
        wait_for(lambda: browser.execute_script("return window.innerWidth") <= 400, 5, "the window did not narrow")
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        background = "return getComputedStyle(document.body).backgroundColor"
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme",
                                                                               "value": "dark"}]})
        assert browser.execute_script(background) == "rgb(21, 24, 28)"
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme",
                                                                               "value": "light"}]})
        assert browser.execute_script(background) == "rgb(255, 255, 255)"
    finally:
        browser.set_window_size(1280, 1000)
    assert console_errors(browser) == []


def test_a_chat_streams_its_answer_and_the_next_turn_hits_the_prefix_cache(browser, served):
    open_page(browser, served)
    new_conversation(browser)
    open_settings(browser)
    set_field(browser, "schema", "")
    set_field(browser, "max-tokens", "40")
    set_field(browser, "temperature", "0")
    send(browser, "Write a short poem about the sea.")
    lengths = set()

    def streamed_then_done():
        shown = answers(browser)
        if shown:
            lengths.add(len(shown[0]["text"]))
            return "finish" in shown[0]["stats"]
        return False
    wait_for(streamed_then_done, 120, "no answer")
    # Seen part-way at least once: text arrived in pieces, not all at the end.
    assert len({n for n in lengths if n > 0}) >= 2, lengths
    first = answers(browser)[0]
    assert first["text"].strip()
    assert number(stat(first, "ttft")) > 0 and stat(first, "ttft").startswith("TTFT ")
    assert number(stat(first, "rate")) > 0 and stat(first, "rate").endswith("tok/s")
    assert number(stat(first, "prompt-tokens")) > 5
    assert stat(first, "tier") == "tier interactive"
    send(browser, "Now one about the mountains.")
    second = finished_answer(browser, 2)
    # The whole first turn is the second turn's prefix: the prefix cache serves its full blocks.
    assert number(stat(second, "prompt-tokens")) > number(stat(first, "prompt-tokens"))
    assert number(stat(second, "cached-tokens")) >= 16
    assert console_errors(browser) == []


def test_a_json_schema_answer_is_shown_formatted_and_marked_valid(browser, served):
    open_page(browser, served)
    new_conversation(browser)
    open_settings(browser)
    set_field(browser, "schema", json.dumps(SCHEMA))
    set_field(browser, "max-tokens", "60")
    send(browser, "A person as JSON with name and age:")
    answer = finished_answer(browser, 1, also="badge")
    assert answer["stats"]["badge valid"] == "valid against the schema"
    assert answer["json"]
    document = json.loads(answer["text"])
    assert set(document) == {"name", "age"} and isinstance(document["age"], int)
    assert answer["text"] == json.dumps(document, indent=2, ensure_ascii=False)  # formatted, as the page shows it
    set_field(browser, "schema", "")
    assert console_errors(browser) == []


def test_the_live_view_shows_steps_moving_while_a_batch_job_runs_to_done(browser, served, tmp_path):
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "gemma-3-270m-Q4_K_M", "max_tokens": 48, "temperature": 0.7,
                       "messages": [{"role": "user", "content": f"Tell a short story about robot number {i}."}]}}
             for i in range(24)]
    batch_file = tmp_path / "stories.jsonl"
    batch_file.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    open_page(browser, served)
    by_id(browser, "tab-batches").click()
    by_id(browser, "batch-file").send_keys(str(batch_file))
    css(browser, "#upload-form button[type=submit]")[0].click()
    wait_for(lambda: css(browser, "#batch-rows tr"), 30, "the batch did not appear")
    by_id(browser, "tab-engine").click()
    steps = lambda: int(by_id(browser, "engine-status").get_attribute("data-steps") or 0)
    start = wait_for(steps, 20, "no steps shown")
    wait_for(lambda: steps() > start + 5, 60, "the step count did not move")
    # A chat beside the batch job: the mixed run the screenshot shows.
    by_id(browser, "tab-chat").click()
    new_conversation(browser)
    open_settings(browser)
    set_field(browser, "schema", "")
    set_field(browser, "max-tokens", "32")
    send(browser, "Say hello in French.")
    finished_answer(browser, 1)
    by_id(browser, "tab-engine").click()
    wait_for(lambda: css(browser, "#engine-batches li[data-status=in_progress], #engine-batches li[data-status=completed]"),
             20, "the batch is not in the live view")
    shot = tmp_path / "web.png"
    browser.set_window_size(1280, 1400)  # tall enough for the batch jobs under the charts
    time.sleep(1)  # the charts redraw at the new width
    browser.save_screenshot(str(shot))
    browser.set_window_size(1280, 1000)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("COBATCH_WEB_SCREENSHOT"):
        shutil.copy(shot, os.environ["COBATCH_WEB_SCREENSHOT"])
    done = wait_for(lambda: browser.execute_script(
        "const p = document.querySelector('#engine-batches li[data-status=completed] progress');"
        "return p && [p.value, p.max]"), 300, "the batch did not finish")
    assert done == [24, 24]
    by_id(browser, "tab-batches").click()
    wait_for(lambda: css(browser, "#batch-rows tr[data-status=completed] a[data-file]"), 10, "no output file link")
    assert console_errors(browser) == []


def _serve(data_dir: Path, *extra: str):
    proc, url = spawn_serve(*SERVE_ARGS, "--data-dir", str(data_dir), *extra)
    wait_serving(proc, url)
    return proc, url


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except Exception:
            proc.kill()
            proc.wait()


def test_a_conversation_survives_a_server_restart_and_can_be_renamed_and_deleted(browser, tmp_path):
    data_dir = tmp_path / "data"
    proc, url = _serve(data_dir)
    try:
        open_page(browser, url)
        open_settings(browser)
        set_field(browser, "schema", "")
        set_field(browser, "max-tokens", "16")
        send(browser, "Name three colours.")
        answer_text = finished_answer(browser, 1)["text"]
        # Listed once the answer is stored with it (the list is drawn again then).
        wait_for(lambda: css(browser, "#conversation-list li[data-count='2']"), 10, "the conversation is not listed")
        css(browser, "#conversation-list li button[title=Rename]")[0].click()
        css(browser, "#conversation-list li input")[0].send_keys("Colours\n")  # the old title is selected
        wait_for(lambda: texts(browser, "#conversation-list li .open") == ["Colours"], 10, "no rename")
    finally:
        _stop(proc)
    proc, url = _serve(data_dir)
    try:
        open_page(browser, url)
        items = wait_for(lambda: css(browser, "#conversation-list li .open"), 10, "nothing listed after the restart")
        assert [b.text for b in items] == ["Colours"]
        items[0].click()
        wait_for(lambda: len(css(browser, "#messages .message")) == 2, 10, "the messages did not come back")
        shown = browser.execute_script(
            "return [...document.querySelectorAll('#messages .message .text')].map((t) => t.textContent)")
        assert shown == ["Name three colours.", answer_text]
        assert stat(answers(browser)[0], "ttft").startswith("TTFT")  # its stats were kept
        css(browser, "#conversation-list li button[title=Delete]")[0].click()
        wait_for(lambda: not css(browser, "#conversation-list li"), 10, "not deleted")
        open_page(browser, url)
        time.sleep(0.5)
        assert not css(browser, "#conversation-list li")
        assert console_errors(browser) == []
    finally:
        _stop(proc)


def test_with_an_api_key_the_page_asks_for_it_and_shows_no_data_without_it(browser, tmp_path):
    proc, url = _serve(tmp_path / "data", "--api-key", "sk-web-test")
    try:
        browser.get(url + "/")
        browser.execute_script("sessionStorage.clear()")
        open_page(browser, url)
        assert by_id(browser, "key-prompt").is_displayed()
        assert not by_id(browser, "app").is_displayed()
        assert by_id(browser, "model-name").text == ""
        assert not css(browser, "#conversation-list li") and not css(browser, "#messages .message")
        by_id(browser, "key-input").send_keys("sk-wrong\n")
        wait_for(lambda: by_id(browser, "key-error").text, 10, "a wrong key was not refused")
        assert by_id(browser, "key-error").text == "That key was not accepted."
        assert not by_id(browser, "app").is_displayed()
        key = by_id(browser, "key-input")
        key.clear()
        key.send_keys("sk-web-test\n")
        wait_for(lambda: by_id(browser, "model-name").text, 10, "the right key did not open the page")
        assert by_id(browser, "app").is_displayed() and not by_id(browser, "key-prompt").is_displayed()
        # Kept for this tab only: session storage, never local storage.
        assert browser.execute_script("return sessionStorage.getItem('cobatch.apiKey')") == "sk-web-test"
        assert browser.execute_script("return localStorage.length") == 0
    finally:
        browser.execute_script("sessionStorage.clear()")
        _stop(proc)
