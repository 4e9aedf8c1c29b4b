"""The dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromedriver``,
driven by selenium): no console errors, every benchmark in the overview, plots that are
not blank, and on a machine whose runs wobble by +-3%, no flag on a steady benchmark and
one on a benchmark that stepped.

Without Chromium the test skips, saying why; under CI (``CI=true``) it fails instead: CI
must run it (.ci/run installs Chromium).
"""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

from polyonnx.bench.history import load_history
from polyonnx.bench.site import write_site
from tests.bench.png import read_png
from tests.bench.synthetic import (
    BENCHES,
    REGRESSION,
    alternating,
    known_history,
    series_history,
    step,
)

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
]


def executable(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    path = pathlib.Path("/usr/bin") / name
    return str(path) if path.is_file() else None


def unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason}: under CI=true the browser test must run (.ci/run installs it)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, chromedriver = executable("chromium"), executable("chromedriver")
    if chromium is None or chromedriver is None:
        unavailable("Chromium is not installed (apt-get install chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (pip install selenium)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("dashboard")
    known_history(root / "history", other_machine=True)
    runs, _ = load_history(root / "history")
    pages = write_site(runs, root / "site")
    return pages[0].parent


def open_page(browser, path: pathlib.Path) -> list[dict]:
    """Load ``path``; the console entries it logged."""
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(path.resolve().as_uri())
    return browser.get_log("browser")


def test_pages_load_without_console_errors(browser, site):
    pages = sorted(site.glob("*.html"))
    assert len(pages) == 2
    for page in pages:
        errors = [entry for entry in open_page(browser, page) if entry["level"] == "SEVERE"]
        assert errors == [], f"{page.name}: {errors}"
        assert browser.title.startswith("polyonnx performance")


def test_overview_lists_every_benchmark_and_links_its_panel(browser, site):
    from selenium.webdriver.common.by import By

    open_page(browser, site / "machine-bench-box-test-cpu-9000-2.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "#overview tr")[1:]
    listed = []
    for row in rows:
        cells = row.find_elements(By.TAG_NAME, "td")
        link = cells[0].find_element(By.TAG_NAME, "a")
        listed.append((link.text, int(cells[1].text)))
        target = link.get_attribute("href").split("#")[1]
        assert browser.find_element(By.ID, target).is_displayed()
    assert sorted(listed) == sorted((b.case, b.threads) for b in BENCHES)
    flagged = browser.find_elements(By.CSS_SELECTOR, "#flagged tr")[1:]
    assert [row.get_attribute("class") for row in flagged] == ["improvement", "regression"]


def test_plot_screenshot_is_not_blank(browser, site):
    from selenium.webdriver.common.by import By

    open_page(browser, site / "machine-bench-box-test-cpu-9000-2.html")
    case, threads = REGRESSION[:2]
    plot = browser.find_element(By.CSS_SELECTOR, f"#b-{case}-{threads}t svg.plot")
    titles = [t.get_attribute("textContent") for t in plot.find_elements(By.TAG_NAME, "title")]
    assert any("commit 5555555555" in title for title in titles)  # commit ids on hover
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
    image = read_png(plot.screenshot_as_png)[..., :3].astype(int)
    height, width, _ = image.shape
    assert width >= 600 and height >= 250
    ink = (image < 240).any(axis=2).mean()
    assert 0.01 < ink < 0.6, f"{ink:.1%} of the plot's pixels are not white"

    def near(color: str) -> int:
        rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(image - rgb).sum(axis=2) < 60).sum())

    assert near("#1f6feb") > 200  # the polyonnx line
    assert near("#e8710a") > 200  # the onnxruntime line
    assert near("#cf222e") > 30  # the regression's ring


STEADY = ("softmax-512x1024", 1)
STEPPED = ("matmul-256", 1)
STEP_AT = 10


@pytest.fixture(scope="module")
def noisy_site(tmp_path_factory) -> pathlib.Path:
    """20 runs of a machine whose runs alternate +-3%: one benchmark steady, one 20% slower
    from run 10 on."""
    root = tmp_path_factory.mktemp("noisy")
    steady = alternating(20)
    series_history(root / "history", {STEADY: steady, STEPPED: step(steady, STEP_AT, 1.2)})
    runs, _ = load_history(root / "history")
    return write_site(runs, root / "site")[0]


def panel_flags(browser, key: tuple[str, int]) -> tuple[int, list[str]]:
    """(the flag rings in a benchmark's plot, the classes of its flagged run-table rows)."""
    from selenium.webdriver.common.by import By

    panel = browser.find_element(By.ID, f"b-{key[0]}-{key[1]}t")
    rings = panel.find_elements(By.CSS_SELECTOR, "svg.plot g.flag")
    flagged = ".runs-scroll tr.regression, .runs-scroll tr.improvement"
    rows = panel.find_elements(By.CSS_SELECTOR, flagged)
    return len(rings), [row.get_attribute("class") for row in rows]


def test_steady_noise_shows_no_flag_and_a_step_one(browser, noisy_site):
    from selenium.webdriver.common.by import By

    errors = [e for e in open_page(browser, noisy_site) if e["level"] == "SEVERE"]
    assert errors == []
    flagged = browser.find_elements(By.CSS_SELECTOR, "#flagged tr")[1:]
    assert len(flagged) == 1
    cells = flagged[0].find_elements(By.TAG_NAME, "td")
    assert cells[0].text == f"{STEPPED[0]} · 1 thread" and cells[1].text.startswith("▲ +2")
    assert cells[-1].text.startswith(f"#{STEP_AT + 1} ")  # run numbers count from 1
    assert panel_flags(browser, STEADY) == (0, [])
    assert panel_flags(browser, STEPPED) == (1, ["regression"])
    ring = browser.find_element(By.CSS_SELECTOR, f"#b-{STEPPED[0]}-1t g.flag title")
    assert f"run #{STEP_AT + 1}" in ring.get_attribute("textContent")

    def red_pixels(key: tuple[str, int]) -> int:
        plot = browser.find_element(By.CSS_SELECTOR, f"#b-{key[0]}-{key[1]}t svg.plot")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
        image = read_png(plot.screenshot_as_png)[..., :3].astype(int)
        return int((np.abs(image - [0xCF, 0x22, 0x2E]).sum(axis=2) < 60).sum())

    assert red_pixels(STEADY) == 0
    assert red_pixels(STEPPED) > 30
    shots = os.environ.get("POLYONNX_SCREENSHOTS")
    if shots:  # to look at the page: POLYONNX_SCREENSHOTS=DIR
        browser.set_window_size(1280, 2600)
        browser.save_screenshot(str(pathlib.Path(shots) / "noisy-dashboard.png"))
