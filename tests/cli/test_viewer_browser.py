"""The viewer in a real browser: headless Chromium (Debian's chromium and chromium-driver, driven by Selenium)
loads a dataset from the S3 endpoint the tests start, shows its text and images, pages, and runs none of the
hostile examples it shows. Skipped only where no browser is installed (.ci/run installs one)."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
from chromium import CHROMEDRIVER, CHROMIUM, MISSING, start_chromium
from conftest import unique

import atlas_remote as ar
from atlas_remote.viewer import view
from atlas_remote.viewer.values import png

pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None, reason=MISSING)
PAYLOADS = [
    "<script>window.__xss = 1</script>",
    '<img src=x onerror="window.__xss = 2">',
    '<svg onload="window.__xss = 3"></svg>',
    '"><iframe srcdoc="<script>parent.__xss = 4</script>"></iframe>',
    '<details open ontoggle="window.__xss = 5">',
    "</td></tr><tr><td><script>window.__xss = 6</script>",
]
SHARD, BLOCK = 50, 10
HOSTILE = range(150, 150 + len(PAYLOADS))
REFUSED = range(160, 170)  # one block: shard 3, block 1


class Opaque:
    """A class no reader allows by default: its block is refused, and shown as its error."""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


def encoded_by_the_browser(driver, mime: str) -> bytes:
    """A 20 x 10 picture encoded by Chromium's own encoder (JPEG, WebP): bytes made by another program than ours."""
    url = driver.execute_script(
        "const c = document.createElement('canvas'); c.width = 20; c.height = 10;"
        "const g = c.getContext('2d'); g.fillStyle = '#c03'; g.fillRect(0, 0, 20, 10);"
        "return c.toDataURL(arguments[0]);",
        mime,
    )
    assert url.startswith(f"data:{mime};base64,")
    return base64.b64decode(url.split(",", 1)[1])


def examples(driver) -> list:
    driver.get("about:blank")
    photos = [png(np.full((10, 20, 3), 90, np.uint8))] + [
        encoded_by_the_browser(driver, m) for m in ("image/jpeg", "image/webp")
    ]
    out: list = []
    for i in range(180):
        pixels = np.zeros((12, 16, 3), np.uint8)
        pixels[:, : i % 16] = (200, 40, 40)
        out.append(
            {
                "id": i,
                "text": f"example {i}: " + "lorem ipsum " * (i % 7),
                "photo": photos[i % 3],
                "pixels": pixels,
                "tokens": np.arange(i, i + 12, dtype=np.int32),
            }
        )
    for i, payload in zip(HOSTILE, PAYLOADS):
        out[i] = {"id": i, "text": payload, "photo": payload.encode(), payload: [payload, {"__proto__": payload}]}
    out[REFUSED[3]] = {"id": REFUSED[3], "text": Opaque()}
    return out


@pytest.fixture(scope="module")
def served(s3_endpoint, browser):
    import s3fs

    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    bucket = unique("viewer")
    s3fs.S3FileSystem(**options, skip_instance_cache=True).mkdir(bucket)
    url = f"s3://{bucket}/ds"
    written = examples(browser)
    with ar.AtlasDatasetWriter(url, SHARD, BLOCK, storage_options=options) as writer:
        for example in written:
            writer.add_example(example)
    server = view(url, options)
    yield server, written
    server.shutdown()
    server.server_close()


def wait(driver, condition, seconds: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds).until(condition)


def rows(driver) -> list:
    return driver.find_elements("css selector", "#examples tbody tr")


def first_index(driver) -> int:
    """The index of the first row shown (read in one step: the rows are replaced when a page arrives)."""
    index = driver.execute_script("const r = document.querySelector('#examples tbody tr'); return r && r.dataset.index")
    return -1 if index is None else int(index)


def cell_text(driver, row: int, column: int) -> str:
    return driver.execute_script(
        "return document.querySelectorAll('#examples tbody tr')[arguments[0]].cells[arguments[1]].textContent",
        row,
        column,
    )


def open_page(driver, url: str) -> None:
    driver.get(url)
    wait(driver, lambda d: len(rows(d)) > 0)


def test_the_page_shows_a_dataset_on_s3(browser, served):
    server, written = served
    open_page(browser, server.url)
    assert len(rows(browser)) == 20 and first_index(browser) == 0
    header = [th.text for th in browser.find_elements("css selector", "#examples thead th")]
    assert header == ["#", "id", "text", "photo", "pixels", "tokens"], "dict keys as columns"
    assert cell_text(browser, 0, 2) == written[0]["text"]
    facts = browser.find_element("id", "facts").text
    assert "180" in facts and "4 of 4 present" in facts and "atlas_remote" in facts
    # PNG, JPEG and WebP bytes, and a uint8 array, each drawn as an image the browser decoded
    for i, width in ((0, 20), (1, 20), (2, 20)):
        photo = rows(browser)[i].find_elements("css selector", "td")[3].find_element("tag name", "img")
        assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", photo) == width
    pixels = rows(browser)[5].find_elements("css selector", "td")[4].find_element("tag name", "img")
    assert browser.execute_script("return arguments[0].naturalWidth", pixels) == 16
    tokens = rows(browser)[5].find_elements("css selector", "td")[5].text
    assert "tokens" in tokens and "5, 6, 7" in tokens, "1-D token arrays as numbers"
    # the charts are drawn (uPlot, served from the package), and the requests shown are the store's own count
    wait(browser, lambda d: d.find_element("id", "sample-note").text.startswith("Sampled:"))
    assert len(browser.find_elements("css selector", "#charts .uplot")) == 5, "4, and its token arrays' lengths"
    assert "every shard (CRC-32 per block" in facts, "not 8 of 4 shards"
    shown = browser.find_element("id", "total-cost").text
    assert int(re.search(r"opened: ([\d,]+)", shown).group(1).replace(",", "")) == server.view.ds.stats.total_requests
    page_cost = browser.find_element("id", "page-cost").text
    assert re.match(r"this page: \d+ requests? \(", page_cost), page_cost
    # nothing came from anywhere but the viewer itself: the page works offline
    origins = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert origins and all(name.startswith(server.url) for name in origins), origins


def test_paging_forward_back_and_by_index(browser, served):
    server, written = served
    open_page(browser, server.url)
    browser.find_element("id", "next").click()
    wait(browser, lambda d: first_index(d) == 20)
    assert cell_text(browser, 0, 2) == written[20]["text"]
    assert "examples 20–39 of 180" in browser.find_element("id", "position").text
    field = browser.find_element("id", "index")
    field.clear()
    field.send_keys("123")
    browser.find_element("css selector", "#goto button").click()
    wait(browser, lambda d: first_index(d) == 123)
    assert rows(browser)[0].find_elements("css selector", "td")[1].text == "123"
    browser.find_element("id", "prev").click()
    wait(browser, lambda d: first_index(d) == 103)


def test_hostile_examples_are_shown_never_run(browser, served):
    server, _ = served
    browser.get(server.url + f"#start={HOSTILE[0]}")  # a link to a page: shown first, or when the link changes
    wait(browser, lambda d: first_index(d) == HOSTILE[0])
    for details in browser.find_elements("css selector", "#examples details"):  # open every fold: ontoggle
        browser.execute_script("arguments[0].open = true", details)
    table = browser.find_element("id", "examples")
    text = table.get_attribute("textContent")
    assert all(payload in text for payload in PAYLOADS), "every payload is shown as text"
    assert (
        browser.execute_script("return window.__xss") is None and browser.execute_script("return parent.__xss") is None
    )
    made = "script, iframe, svg, img:not(.v-image), [onerror], [onload], [ontoggle]"
    assert table.find_elements("css selector", made) == [], "no element was made from a dataset's text"
    assert len(browser.find_elements("css selector", "script")) == 2, "only the page's two scripts"
    # the refused block stands as the library's one-line error, in place of its examples; the others are shown
    with pytest.raises(ar.UnsafePickleError) as refusal:
        ar.open(server.view.ds.url, server.view.ds.storage_options)[REFUSED[0]]
    assert "shard 3 block 1" in str(refusal.value) and "Opaque" in str(refusal.value)
    shown = {int(r.get_attribute("data-index")): r for r in rows(browser)}
    for i in REFUSED:
        assert shown[i].find_element("css selector", "td.refused").get_attribute("textContent") == str(refusal.value)
    assert [i for i, r in shown.items() if r.find_elements("css selector", "td.refused")] == list(REFUSED)


def test_a_token_dataset_is_readable(browser, tmp_path):
    """Before: each row printed every token sent (256 filled the table's width) and the text column was squeezed
    to a few letters a line; no document-length histogram."""
    rng = np.random.default_rng(0)
    url = str(tmp_path / "tokens")
    with ar.AtlasDatasetWriter(url, 50, 10) as writer:
        writer.add_examples(
            {"text": "a sentence of plain words " * 8, "tokens": rng.integers(0, 50_000, 500).astype(np.uint16)}
            for _ in range(100)
        )
    server = view(url)
    try:
        open_page(browser, server.url)
        fold = rows(browser)[0].find_elements("css selector", "td")[2].find_element("css selector", "details")
        shown = fold.find_element("tag name", "summary").text
        assert shown.count(",") == 16 and shown.endswith("500 values"), "the first 16 tokens, and how many"
        assert not fold.get_attribute("open")
        browser.execute_script("arguments[0].open = true", fold)
        assert "(the first 256 of 500)" in fold.text, "opened: every token sent, and how many there are"
        text = rows(browser)[0].find_elements("css selector", "td")[1]
        assert text.size["width"] >= 250, f"the text column keeps room to be read: {text.size}"
        wait(browser, lambda d: d.find_element("id", "sample-note").text.startswith("Sampled:"))
        titles = [h.text for h in browser.find_elements("css selector", "#charts h3")]
        assert 'Document lengths in the sample (tokens under "tokens")' in titles, titles
        assert "documents of 500 to 500 tokens" in browser.find_element("id", "sample-note").text
    finally:
        server.shutdown()
        server.server_close()
