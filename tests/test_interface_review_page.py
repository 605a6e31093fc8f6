"""The review item page of a complex (issue 43, item 4) in Debian's Chromium: the chain-pair
table (ipTM, ipSAE, pDockQ2, LIS, actifpTM, interface PAE) sits above the fold with the item's
own numbers, the weak pair named by `low_ipsae` is marked, and the PAE heatmap carries the
chain boundaries and chain labels. Screenshot: env PROTDP_SCREENSHOT_DIR or the tmp folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from review_fixtures import (CHROMIUM, CHROMIUM_ARGS, complex_item, queue_with,
                             review_server)

VIEWPORT = {"width": 1300, "height": 900}


def test_item_page_shows_chain_pairs_above_the_fold(tmp_path):
    url = str(tmp_path / "queue.sqlite")
    store, _, tokens = queue_with(url, "alice")
    item = complex_item(tmp_path / "complex")
    item_id = store.enqueue(**item)
    scores = store.get(item_id)["scores"]
    [mx] = [r for r in scores["interface_scores"] if r["type"] == "max"]
    assert "low_ipsae" in item["reasons"]              # random weights: a weak interface
    shots = Path(os.environ.get("PROTDP_SCREENSHOT_DIR") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    with review_server(url, tmp_path / "server.log") as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(base + "/login")
        page.fill("#token", tokens["alice"])
        page.click("#login")
        page.wait_for_url(base + "/queue")
        page.goto(f"{base}/items/{item_id}")
        row = page.locator("#chain-pairs tbody tr")
        assert row.count() == 1 and row.get_attribute("data-pair") == "A-B"
        assert row.get_attribute("class") == "weak"
        cells = row.locator("td").all_inner_texts()
        pae = (scores["chain_pair_pae"]["A"]["B"] + scores["chain_pair_pae"]["B"]["A"]) / 2
        assert cells == [f"{scores['chain_pair_iptm']['A']['B']:.3f}", f"{mx['ipsae']:.3f}",
                         f"{mx['pdockq2']:.3f}", f"{mx['lis']:.3f}", f"{mx['actifptm']:.3f}", f"{pae:.1f} Å"]
        box = page.locator("#chain-pairs").bounding_box()
        assert box["y"] + box["height"] <= VIEWPORT["height"], box     # above the fold
        labels = page.locator("#pae-overlay text.chain-label-pae").all_text_contents()
        assert labels == ["A", "B"]
        assert page.locator("#pae-overlay line.chain-boundary").count() == 2
        assert "low_ipsae" in page.inner_text("#reasons")
        page.screenshot(path=str(shots / "item_complex_chain_pairs.png"))
        page.locator("figure.pae").screenshot(path=str(shots / "item_complex_pae.png"))
        browser.close()
        assert problems == [], problems
    store.close()
