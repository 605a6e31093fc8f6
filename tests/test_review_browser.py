"""End-to-end in a real browser: `protdp review serve` (uvicorn, separate process) driven by
Playwright with Debian's Chromium (/usr/bin/chromium; never `playwright install`).

Log in with a reviewer token, open a flagged item, approve it, see it leave the queue and
appear in the export; an XSS payload in another target name must stay inert text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from review_fixtures import CHROMIUM, CHROMIUM_ARGS, gated_item, queue_with, review_server


XSS = '<img src=x onerror="alert(document.cookie)"><script>alert(1)</script>'


@pytest.fixture
def server(tmp_path):
    url = str(tmp_path / "queue.sqlite")
    store, admin, tokens = queue_with(url, "alice")
    token = tokens["alice"]
    store.enqueue(**gated_item(1, target="KRAS_G12C", out_dir=tmp_path / "preds"))
    store.enqueue(**gated_item(2, target=XSS))
    store.enqueue(**gated_item(3, target="TP53_core"))
    with review_server(url, tmp_path / "server.log") as base:
        yield base, token, store, tmp_path


def test_login_open_approve_and_export_in_chromium(server):
    base, token, store, tmp_path = server
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing (apt-get install chromium)"
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(accept_downloads=True)
            page = context.new_page()
            page.set_default_timeout(20_000)
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

            page.goto(base + "/queue")
            assert page.url.startswith(base + "/login")
            page.fill("#token", "pdr_wrong")
            page.click("#login")
            assert "Token not recognised" in page.inner_text("main")
            page.fill("#token", token)
            page.click("#login")
            page.wait_for_url(base + "/queue")
            assert page.inner_text("#reviewer-name") == "alice"
            targets = page.locator("#queue a.target").all_inner_texts()
            assert targets == ["KRAS_G12C", XSS, "TP53_core"]  # payload shown as plain text

            page.click("#queue a.target >> text=KRAS_G12C")
            page.wait_for_url(base + "/items/1")
            assert page.locator("#plddt-plot polyline").count() == 1
            assert page.locator("#plddt-plot").is_visible()
            assert "low_mean_plddt" in page.inner_text("#reasons")
            assert "Very low (pLDDT < 50)" in page.inner_text("#afdb-bands")
            with page.expect_download() as download:  # chemical/x-pdb: saved, not shown
                page.click("a.file >> text=pdb")
            assert Path(download.value.path()).read_text() == \
                (Path(store.get(1)["folder"]) / store.get(1)["paths"]["pdb"]).read_text()

            page.fill("#comment", "fold agrees with the KRAS crystal structure")
            page.click("#approve")
            page.wait_for_url(base + "/queue?decided=1")
            assert "approved" in page.inner_text("#notice")
            assert page.locator("#queue a.target").all_inner_texts() == [XSS, "TP53_core"]

            with page.expect_download() as download:
                page.click("#export-jsonl")
            records = [json.loads(line) for line in
                       Path(download.value.path()).read_text().splitlines()]
            assert [(r["target"], r["decision"], r["decided_by"], r["comment"])
                    for r in records] == [("KRAS_G12C", "approved", "alice",
                                           "fold agrees with the KRAS crystal structure")]
            assert [e["action"] for e in records[0]["events"]] == ["enqueued", "approved"]

            page.click("#queue a.target >> nth=0")  # the XSS-named item: still inert
            page.wait_for_url(base + "/items/2")
            assert page.inner_text("#target") == XSS
            assert page.locator("#plddt-plot").is_visible()
        finally:
            browser.close()
    assert dialogs == [], f"script ran in the page: {dialogs}"
    assert store.get(1)["state"] == "approved" and store.get(2)["state"] == "pending"
