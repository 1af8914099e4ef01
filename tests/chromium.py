"""Headless Chromium for the viewer's browser tests and its benchmark (benchmarks/viewer.py): Debian's chromium
and chromium-driver, driven by Selenium (the `test` extra), with a fresh profile and the flags that keep it off
the network."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
MISSING = (  # why the browser tests are skipped where there is none
    "no browser installed: the viewer's browser tests need Debian's chromium and chromium-driver "
    "(apt-get install -y chromium chromium-driver, as .ci/run does)"
)
FLAGS = [  # headless, and nothing that reaches out to the network (this machine's is closed)
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
]


def start_chromium(profile: str | Path) -> Any:
    """A Selenium driver of a new headless Chromium whose profile is the (empty) folder `profile`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
