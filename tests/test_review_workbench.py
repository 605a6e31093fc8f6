"""The reviewer's workbench in a real browser (Debian's Chromium via Playwright, the real
`protdp review serve` in its own process): the 3D view of a structure the predictor really
wrote (and of an all-atom model), the sequence, PAE and MSA panels, claim-next under two
concurrent reviewers, keyboard shortcuts, lease countdown and renewal, drafts, batch approve.

Screenshots go to env PROTDP_SCREENSHOT_DIR (default: the test's tmp folder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import gemmi
import numpy as np
import pytest
from playwright.sync_api import sync_playwright
from review_fixtures import (CHROMIUM, CHROMIUM_ARGS, complex_item, gated_item,
                             predict_into_queue, queue_with, review_server)

N_SIMPLE = 6                      # gated items 3..8 besides the two structures
COMPLEX_ID = 3 + N_SIMPLE         # a heterodimer (AlphaFold-Multimer fixture outputs)


@pytest.fixture(scope="module")
def bench(tmp_path_factory, data_dir):
    """A queue with a real prediction (item 1), an all-atom model (item 2) and gated items,
    served by `protdp review serve`; yields (base URL, store, tokens, shots folder)."""
    tmp = tmp_path_factory.mktemp("workbench")
    url = str(tmp / "queue.sqlite")
    store, admin, tokens = queue_with(url, "alice", "bob")
    predict_into_queue(tmp / "run", url, data_dir)
    allatom = tmp / "allatom"
    allatom.mkdir()
    shutil.copy(data_dir / "structures" / "2p90_A02.pdb", allatom / "model.pdb")
    st = gemmi.read_structure(str(allatom / "model.pdb"))
    seq = gemmi.one_letter_code([r.name for r in st[0][0]])
    ca_b = [r["CA"][0].b_iso for r in st[0][0]]
    item = gated_item(2, mean=float(np.mean(ca_b)), length=len(seq))
    store.enqueue(**{**item, "prediction_id": "allatom/model", "target": "2p90_A02 all-atom",
                     "scores": {**item["scores"], "sequence": seq, "plddt": ca_b},
                     "paths": {"pdb": allatom / "model.pdb"}})
    for i in range(3, 3 + N_SIMPLE):
        store.enqueue(**gated_item(i, out_dir=tmp / "preds"))
    assert store.enqueue(**complex_item(tmp / "complex")) == COMPLEX_ID
    shots = Path(os.environ.get("PROTDP_SCREENSHOT_DIR") or tmp / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    with review_server(url, tmp / "server.log") as base:
        yield base, store, tokens, shots


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing (apt-get install chromium)"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _wait_text(page, selector: str, pattern: str, timeout_s: float = 15.0) -> str:
    """Poll an element's text until it matches (polled from Python: the page's CSP forbids the
    eval that a string `wait_for_function` needs)."""
    deadline = time.time() + timeout_s
    while True:
        text = page.inner_text(selector)
        if re.search(pattern, text):
            return text
        assert time.time() < deadline, f"{selector}: {text!r} never matched {pattern!r}"
        page.wait_for_timeout(100)


def _wait_until(page, ready, what: str, timeout_s: float = 30.0) -> None:
    """Poll `ready()` from Python until it is true (a string `wait_for_function` needs an eval
    the page's CSP forbids, which fails whenever the predicate is not true at once)."""
    deadline = time.time() + timeout_s
    while not ready():
        assert time.time() < deadline, f"{what} never happened"
        page.wait_for_timeout(50)


def _page(browser, base: str, token: str, problems: list):
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(base + "/login")
    page.fill("#token", token)
    page.click("#login")
    page.wait_for_url(base + "/queue")
    return page


def _viewer_loaded(page) -> dict:
    _wait_until(page, lambda: page.get_attribute("#viewer", "data-state") != "loading",
                "the 3D viewer leaving its loading state")
    return page.eval_on_selector("#viewer", "el => ({...el.dataset})")


def _painted_fraction(png: bytes) -> float:
    """Share of pixels of a screenshot that are not the white background."""
    import io

    from PIL import Image
    arr = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)
    return float((np.abs(arr - 255).sum(axis=-1) > 60).mean())


def test_viewer_loads_the_predicted_structure_coloured_by_plddt(bench, browser):
    base, store, tokens, shots = bench
    problems: list[str] = []
    page = _page(browser, base, tokens["alice"], problems)
    page.goto(base + "/items/1")
    item = store.get(1)
    pdb = Path(item["folder"]) / item["paths"]["pdb"]
    data = _viewer_loaded(page)
    assert data["state"] == "loaded", data
    st = gemmi.read_structure(str(pdb))                   # an independent reader
    assert int(data["atoms"]) == st[0].count_atom_sites()
    assert int(data["residues"]) == len(item["scores"]["sequence"]) == len(st[0][0])
    ca_b = [float(b) for b in data["bfactors"].split(",")]
    assert ca_b == pytest.approx(item["scores"]["plddt"], abs=0.01)   # B-factor = pLDDT
    time.sleep(0.5)
    assert _painted_fraction(page.locator("#viewer").screenshot()) > 0.01  # WebGL drew it
    assert page.locator("#sequence .res").count() == item["length"]
    low = page.locator("#sequence .res.band-low").count()
    assert low == sum(1 for v in item["scores"]["plddt"] if 50 <= v < 70)
    assert page.eval_on_selector("#pae", "img => img.naturalWidth") == item["length"]
    assert page.locator("#coverage-plot polyline").count() >= 1
    assert re.fullmatch(r"0\.\d{3}", page.inner_text("#ptm"))
    assert "16 rows used" in page.inner_text("#msa-depth")
    page.click("#sequence .res >> nth=9")                # a residue centres the view on it
    assert page.locator("#sequence .res.picked").count() == 1
    page.screenshot(path=str(shots / "workbench_prediction.png"), full_page=True)

    page.goto(base + "/items/2")                          # an all-atom model: side chains
    data = _viewer_loaded(page)
    st = gemmi.read_structure(str(Path(store.get(2)["folder"]) / "model.pdb"))
    assert data["state"] == "loaded" and int(data["atoms"]) == st[0].count_atom_sites()
    assert int(data["sidechainAtoms"]) > 100
    time.sleep(0.5)
    assert _painted_fraction(page.locator("#viewer").screenshot()) > 0.01
    page.locator("#viewer").screenshot(path=str(shots / "viewer_all_atom.png"))
    assert problems == [], problems
    page.context.close()


def test_complex_item_chains_interface_pae_and_iptm(bench, browser):
    """A complex: chains in their own colours (pLDDT colouring one click away), the PAE image
    with chain boundaries and the interface blocks outlined where the chains' ranges put them,
    ipTM / pTM / chain-pair ipTM from the item's scores; the footer says approve takes a twice."""
    base, store, tokens, shots = bench
    problems: list[str] = []
    page = _page(browser, base, tokens["alice"], problems)
    assert "a a (twice) approve" in page.inner_text("footer")
    page.goto(f"{base}/items/{COMPLEX_ID}")
    item = store.get(COMPLEX_ID)
    scores, chains = item["scores"], item["scores"]["chains"]
    data = _viewer_loaded(page)
    assert data["state"] == "loaded", data
    assert data["colouring"] == "chain" and data["chainIds"] == "A,B"
    colours = data["chainColours"].split(",")
    assert len(set(colours)) == 2 and "#808080" not in colours
    n = chains[-1]["end"]
    assert int(data["residues"]) == n
    time.sleep(0.5)
    by_chain = page.locator("#viewer").screenshot()
    assert _painted_fraction(by_chain) > 0.01
    page.screenshot(path=str(shots / "workbench_complex.png"), full_page=True)
    page.click("#colour-toggle")                          # pLDDT colouring kept
    assert page.eval_on_selector("#viewer", "el => el.dataset.colouring") == "plddt"
    assert page.inner_text("#colour-by") == "coloured by pLDDT"
    assert page.locator("#band-legend").is_visible()
    time.sleep(0.3)
    by_plddt = page.locator("#viewer").screenshot()
    assert by_plddt != by_chain
    page.locator("#viewer").screenshot(path=str(shots / "viewer_complex_plddt.png"))
    page.click("#colour-toggle")
    assert page.eval_on_selector("#viewer", "el => el.dataset.colouring") == "chain"

    assert page.inner_text("#iptm") == f"{scores['iptm']:.3f}"
    assert page.inner_text("#ptm") == f"{scores['ptm']:.3f}"
    assert page.inner_text("#interface-pae") == f"{scores['interface_pae']:.1f} Å"
    cells = page.locator("#chain-pair-iptm tbody td").all_inner_texts()
    assert cells == [f"{scores['chain_pair_iptm'][a][b]:.3f}" for a in "AB" for b in "AB"]
    assert "low_iptm" in page.inner_text("#reasons")
    # PAE: the whole complex, one boundary per axis at chain B's start, both interface blocks
    assert page.eval_on_selector("#pae", "img => img.naturalWidth") == n
    size = 360
    x_b = chains[1]["start"] * size / n
    lines = page.eval_on_selector_all("#pae-overlay line.chain-boundary",
                                      "ls => ls.map(l => [l.x1.baseVal.value, l.y1.baseVal.value])")
    assert [v for xy in sorted(lines) for v in xy] == pytest.approx([0, x_b, x_b, 0], abs=0.01)
    blocks = page.eval_on_selector_all(
        "#pae-overlay rect.interface-block",
        "rs => rs.map(r => [r.dataset.pair, r.x.baseVal.value, r.y.baseVal.value, "
        "r.width.baseVal.value, r.height.baseVal.value])")
    assert [b[0] for b in blocks] == ["A-B", "B-A"]
    assert [v for b in blocks for v in b[1:]] == pytest.approx(
        [x_b, 0, size - x_b, x_b, 0, x_b, x_b, size - x_b], abs=0.01)
    page.locator("figure.pae").screenshot(path=str(shots / "pae_complex.png"))
    assert problems == [], problems
    page.context.close()


def _claim_next_together(pages) -> list[str]:
    """Both reviewers press "Claim next" at the same moment; returns where each landed."""
    for p in pages:
        p.evaluate("document.getElementById('claim-next').click()")
    for p in pages:
        p.wait_for_load_state()
        _wait_until(p, lambda: not urlparse(p.url).path.startswith("/queue")
                    or "empty" in urlparse(p.url).query, "claim next landing")
    return [p.url for p in pages]


def test_claim_next_never_collides_between_two_reviewers(bench, browser):
    base, store, tokens, shots = bench
    problems: list[str] = []
    pages = [_page(browser, base, tokens[n], problems) for n in ("alice", "bob")]
    got: dict[str, list[int]] = {"alice": [], "bob": []}
    for _ in range(12):
        for p in pages:
            p.goto(base + "/queue")
        urls = _claim_next_together(pages)
        for name, u in zip(("alice", "bob"), urls):
            m = re.search(r"/items/(\d+)$", u)
            if m:
                got[name].append(int(m.group(1)))
        if all("empty=1" in u for u in urls):
            break
    pages[0].screenshot(path=str(shots / "claim_next_empty.png"), full_page=True)
    open_ids = {i["id"] for i in store.list("all", limit=100)}
    claimed = got["alice"] + got["bob"]
    assert len(claimed) == len(set(claimed)) == len(open_ids)   # every item once, no collision
    assert got["alice"] and got["bob"]
    for name, ids in got.items():
        assert all(store.get(i)["claimed_by"] == name for i in ids)
    assert problems == [], problems
    # release everything again for the next test
    for name in ("alice", "bob"):
        rev = store.reviewer(tokens[name])
        for i in got[name]:
            rev.release(i)
    for p in pages:
        p.context.close()


def test_keyboard_shortcuts_lease_renewal_drafts_and_batch(bench, browser):
    base, store, tokens, shots = bench
    problems: list[str] = []
    page = _page(browser, base, tokens["alice"], problems)
    _wait_until(page, lambda: page.get_attribute("body", "data-shortcuts") == "ready",
                "the keyboard shortcuts being ready")
    page.keyboard.press("j")
    page.keyboard.press("j")
    assert page.locator("#queue tr.cursor").get_attribute("data-item-id") == "2"
    page.keyboard.press("o")
    page.wait_for_url(base + "/items/2")
    page.keyboard.press("k")
    page.wait_for_url(base + "/items/1")
    page.keyboard.press("j")
    page.wait_for_url(base + "/items/2")
    page.keyboard.press("c")                               # claim this one
    page.wait_for_url(base + "/items/2")
    # the countdown is drawn by the page's script once it runs (the server renders "N min left")
    _wait_text(page, "#lease", r"your lease: 1[45]:\d\d left")
    with page.expect_response(lambda r: r.request.method == "POST" and r.ok):
        page.click("#renew")                               # the renewal's own request
    _wait_text(page, "#lease", r"your lease: 1[45]:\d\d left")
    assert store.events(2)[-1]["action"] == "renewed"
    page.keyboard.press("r")                               # reject needs a comment
    assert "comment is required" in page.inner_text("#decide-hint")
    assert store.get(2)["state"] == "claimed"
    page.fill("#comment", "ar: all residues disordered, e.g. a loop")  # typed letters are text
    assert store.get(2)["state"] == "claimed"
    page.reload()                                          # the draft survives a reload
    assert page.input_value("#comment") == "ar: all residues disordered, e.g. a loop"
    page.screenshot(path=str(shots / "workbench_draft.png"), full_page=True)
    page.locator("#comment").blur()
    page.keyboard.press("r")
    page.wait_for_url(base + "/queue?decided=2")
    assert store.get(2)["state"] == "rejected"
    assert store.get(2)["comment"] == "ar: all residues disordered, e.g. a loop"
    page.keyboard.press("n")                               # claim next from the queue
    page.wait_for_url(re.compile(r".*/items/\d+$"))
    claimed = int(page.url.rsplit("/", 1)[1])
    assert store.get(claimed)["claimed_by"] == "alice"
    page.goto(f"{base}/items/1")                           # the real prediction's 3D view
    page.click("#viewer")
    page.keyboard.press("a")
    page.keyboard.press("a")                               # never approves from the viewer
    assert "3D view" in page.inner_text("#decide-hint")
    assert store.get(1)["state"] in ("pending", "claimed")
    page.goto(f"{base}/items/{claimed}")
    page.keyboard.press("a")                               # arms only
    assert "again" in page.inner_text("#decide-hint") and store.get(claimed)["state"] == "claimed"
    page.keyboard.press("a")
    page.wait_for_url(base + f"/queue?decided={claimed}")
    assert store.get(claimed)["state"] == "approved"
    # batch approve a selection with one comment
    rows = page.locator("#queue tbody tr[data-item-id]")
    picked = [rows.nth(k).get_attribute("data-item-id") for k in (0, 1)]
    for item_id in picked:                                 # only opened items may be approved
        page.goto(f"{base}/items/{item_id}")
    page.goto(base + "/queue")
    rows = page.locator("#queue tbody tr[data-item-id]")
    for k in (0, 1):
        rows.nth(k).locator("input.pick").check()
    assert page.inner_text("#selected-count") == "2 selected"
    page.fill("#batch-comment", "checked together")
    page.fill("#batch-confirm", "2")
    page.screenshot(path=str(shots / "queue_selection.png"), full_page=True)
    page.click("#batch-approve")
    page.wait_for_selector("#batch-results")
    assert [store.get(int(i))["state"] for i in picked] == ["approved", "approved"]
    assert {store.get(int(i))["comment"] for i in picked} == {"checked together"}
    page.screenshot(path=str(shots / "batch_result.png"), full_page=True)
    assert problems == [], problems
    page.context.close()
    assert json.loads(json.dumps(store.verify()))["ok"]
