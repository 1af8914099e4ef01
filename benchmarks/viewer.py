"""What the viewer's first page costs on a dataset of 10,000 and 100,000 shards, on an S3 endpoint adding 20 ms a
request (folder_s3.py over hard-linked tiny shards with a manifest, as scale.py makes them).

Measured, best of --repeats, each with a dataset opened anew:

- server side: opening the dataset and answering the page's first two questions (the summary, the first 20
  examples), with the endpoint's own count of the requests;
- in headless Chromium (Debian's chromium + chromium-driver, as the tests use): from before the open to the
  first page's rows in the browser, the requests the page itself shows;
- example 10,000,000 (100,000 shards: 100 million examples): the requests of its page, by object.

    python benchmarks/viewer.py [--shards 10000 100000] [--latency 0.02] [--repeats 3]
        # writes the "The viewer" section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from chromium import start_chromium
from convert import write_section
from folder_s3 import serve
from scale import BUCKET, requests_between, server_stats, tiny_shards

import atlas_remote as ar
from atlas_remote.viewer import ViewerServer
from atlas_remote.viewer.pages import DatasetView

DEEP = 10_000_000


def browser():
    return start_chromium(tempfile.mkdtemp(prefix="atlas-bench-chromium-"))


def server_side(url: str, options: dict, endpoint: str) -> dict:
    before, started = server_stats(endpoint), time.perf_counter()
    view = DatasetView(ar.open(url, storage_options=options))
    opened = time.perf_counter() - started
    view.answer(view.summary)
    view.answer(view.page, 0, 20)
    return {
        "seconds": time.perf_counter() - started,
        "open": opened,
        "requests": requests_between(before, server_stats(endpoint)),
    }


FIRST_ROWS = (  # the summary's and the first page's own costs (the charts' sample comes after them)
    "const r = document.querySelector('#examples tbody tr'), s = document.getElementById('summary-cost').textContent;"
    "return r && s ? [s, document.getElementById('page-cost').textContent] : null"
)


def in_browser(driver, url: str, options: dict) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get("about:blank")
    started = time.perf_counter()
    server = ViewerServer(ar.open(url, storage_options=options)).start()
    opened = server.view.ds.stats.total_requests
    try:
        driver.get(server.url)
        summary, page = WebDriverWait(driver, 60, poll_frequency=0.005).until(lambda d: d.execute_script(FIRST_ROWS))
        seconds = time.perf_counter() - started
    finally:
        server.shutdown()
        server.server_close()
    shown = sum(int(re.search(r": ([\d,]+) request", text).group(1).replace(",", "")) for text in (summary, page))
    return {"seconds": seconds, "requests": opened + shown, "page": page}


def deep(url: str, options: dict, endpoint: str) -> dict:
    view = DatasetView(ar.open(url, storage_options=options))
    before = server_stats(endpoint)
    answer = view.answer(view.page, DEEP, 1)
    after = server_stats(endpoint)
    objects = {
        k: n - before["objects"].get(k, 0) for k, n in after["objects"].items() if n > before["objects"].get(k, 0)
    }
    return {"seconds": answer["cost"]["seconds"], "by_kind": answer["cost"]["by_kind"], "objects": objects}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    driver = browser()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / BUCKET
            for count in args.shards:
                tiny_shards(folder / f"s{count}", count)
            with serve(tmp, args.latency) as endpoint:
                options = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
                for count in args.shards:
                    url = f"s3://{BUCKET}/s{count}"
                    servers = [server_side(url, options, endpoint) for _ in range(args.repeats)]
                    browsers = [in_browser(driver, url, options) for _ in range(args.repeats)]
                    far = deep(url, options, endpoint) if count * 1000 > DEEP else None
                    rows.append((count, servers, browsers, far))
                    print(count, servers, browsers, far, flush=True)
    finally:
        driver.quit()
    report(rows, args)


def report(rows: list, args: argparse.Namespace) -> None:
    lines = [
        "## The viewer",
        "",
        f"`python benchmarks/viewer.py` on `folder_s3.py` adding {args.latency * 1000:.0f} ms to every request; datasets of "
        "tiny shards (1,000 one-example blocks each) with a manifest, as `scale.py` makes them. Best of "
        f"{args.repeats}, each opened anew; the machine (2 cores) was shared with other work while this ran. "
        "Target: the first page of a 10,000-shard dataset in at most 1 s and 10 requests.",
        "",
        "| shards | open + summary + first 20 examples (server) | requests (endpoint's count) | from open to rows in Chromium | requests (open + those the page shows) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for count, servers, browsers, _ in rows:
        s = min(servers, key=lambda r: r["seconds"])
        b = min(browsers, key=lambda r: r["seconds"])
        lines.append(
            f"| {count:,} | {s['seconds']:.2f} s (open {s['open']:.2f} s) | {s['requests']} | {b['seconds']:.2f} s | {b['requests']} |"
        )
    for count, _, _, far in rows:
        if far:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(far["by_kind"].items()))
            lines += [
                "",
                f"Example {DEEP:,} of the {count:,}-shard dataset ({count * 1000:,} examples), its page alone: {kinds} "
                f"({far['seconds']:.2f} s): the shard's index and checksums, then one ranged read of one block.",
            ]
    print("\n".join(lines))
    write_section("## The viewer", lines)


if __name__ == "__main__":
    main()
