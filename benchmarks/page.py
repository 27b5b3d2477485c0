"""Check `mtx serve`'s page (GET /) in a real headless browser, as a person would use it.

    pip install playwright            # the Python driver; the browser is Debian's
    apt-get install chromium
    python -m benchmarks.page --checkpoint CKPT --text "A man rides a bike." --shot page.png
    python -m benchmarks.page --checkpoint MULTILINGUAL --tgt-lang de ...   (chooses it on the page)

Starts a server on 127.0.0.1, opens the page in headless Chromium, types the text into the box,
presses Translate, waits for the translation, reads it and the attention heatmap from the page,
checks the translation equals POST /translate's for the same text, and takes a screenshot.
Not a benchmark: a check that needs a browser (which CI does not install), beside the suite
because it starts its server with the suite's launcher (server.py).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from mtx.bench.server import Server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--text", default="A man in a blue shirt is riding a bike.")
    ap.add_argument("--shot", type=Path, default=Path("page.png"))
    ap.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--tgt-lang", help="a multilingual model: the language chosen on the page")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with Server(args.checkpoint) as server, sync_playwright() as p:
        into = {"tgt_lang": args.tgt_lang} if args.tgt_lang else {}
        expected = server.translate(args.text, **into)[1]["translations"][0]
        browser = p.chromium.launch(executable_path=args.browser, headless=True)
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: None if "127.0.0.1" in r.url else errors.append(r.url))
        page.goto(f"http://127.0.0.1:{server.port}/")
        page.wait_for_function("document.getElementById('about').textContent.length > 0")
        page.fill("#source", args.text)
        if args.tgt_lang:
            page.select_option("#lang", args.tgt_lang)
        page.click("#go")
        page.wait_for_selector("body[data-done='1']", timeout=60_000)
        shown = page.inner_text("#translation")
        rows = page.locator("#heatmap tbody tr").count()
        cols = page.locator("#heatmap thead th").count() - 1
        page.screenshot(path=str(args.shot), full_page=True)
        browser.close()
        assert server.stop() == 0
    print(f"typed:      {args.text}")
    print(f"page shows: {shown}")
    print(f"heatmap:    {rows} output rows x {cols} source columns")
    print(f"screenshot: {args.shot}")
    assert not errors, f"page errors or requests off 127.0.0.1: {errors}"
    assert shown == expected, f"the page shows {shown!r}, POST /translate gives {expected!r}"
    assert rows > 1 and cols > 1, "no heatmap"
    print("ok: the page's translation equals POST /translate's")


if __name__ == "__main__":
    main()
