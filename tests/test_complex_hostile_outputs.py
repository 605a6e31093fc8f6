"""Write access and byte binding of complex predictions (issue 32 audit).

- Links planted in the output folder (summary.csv and CURRENT pointing at a file outside, a
  complex's target folder linked to a folder outside, ranked_0.pdb of a finished prediction
  replaced by a link to a file outside): protdp never writes through them, never takes a
  linked file as its own finished output, and the outside files keep their bytes. A linked
  target folder is one rejected line; the other complex is predicted.
- A complex's review item binds the bytes the gate sent: once ranked_0.pdb / the PAE JSON
  change on disk the workbench names them, does not serve them and refuses the approval;
  with the bytes restored the approval goes through, and a file changed after the approval
  keeps it out of the trusted export. The sequence panel numbers each residue as the structure
  file does (chain, number within the chain; it numbered the whole complex, so a click on
  chain B's first residue selected B37).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import warnings

import gemmi

from protdp.cli import main as protdp_main
from protdp.data.parse import parse_msa
from protdp.inference.writers import read_summary
from protdp.review.binding import mismatches
from protdp.review.store import ReviewStore
from protdp.review.trusted import trusted_records
from protdp.review.web import create_app
from protdp.review.web.render import complex_view
from review_fixtures import queue_with
from test_complex_predict import COMMON, RAW, _msa_dir, ckpt  # noqa: F401  (fixture)
from test_review_web import csrf_of, logged_in

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient  # noqa: F401


def _fasta(tmp_path):
    qa, qb = parse_msa(RAW / "hbA_1-36.a3m").query, parse_msa(RAW / "hbB_1-40.a3m").query
    fasta = tmp_path / "complexes.fasta"
    fasta.write_text(f">hb\n{qa}:{qb}\n>hb2\n{qb}:{qa}\n")
    msas = _msa_dir(tmp_path, {"hb": ("hbA_1-36", "hbB_1-40", False),
                               "hb2": ("hbB_1-40", "hbA_1-36", False)})
    return fasta, msas


def _args(ckpt, fasta, msas, out, *extra):  # noqa: F811
    return ["predict", "--checkpoint", str(ckpt), "--fasta", str(fasta), "--msa-dir",
            str(msas), "--out", str(out), *COMMON, *extra]


def test_links_in_the_output_folder_are_never_written_through(tmp_path, ckpt, capsys):  # noqa: F811
    fasta, msas = _fasta(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    elsewhere = outside / "folder"
    elsewhere.mkdir()
    out = tmp_path / "out"
    (out / "targets").mkdir(parents=True)
    (out / "summary.csv").symlink_to(secret)
    (out / "targets" / "hb2").symlink_to(elsewhere, target_is_directory=True)
    assert protdp_main(_args(ckpt, fasta, msas, out)) == 0
    capsys.readouterr()
    assert secret.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert list(elsewhere.iterdir()) == []                  # nothing written through the link
    assert not (out / "summary.csv").is_symlink()           # our own file now, beside the link
    rows = {r["target"]: r for r in read_summary(out / "summary.tsv")}
    assert rows["hb"]["status"] == "predicted"
    assert rows["hb2"]["route"] == "rejected"
    assert f"{out / 'targets' / 'hb2'}: is a symbolic link" in rows["hb2"]["detail"]

    # a finished prediction's ranked_0.pdb and CURRENT replaced by links to a file outside:
    # the rerun takes nothing linked as its own, sets the folder aside and redoes it
    tdir = out / "targets" / "hb"
    pid = (tdir / "CURRENT").read_text().strip()
    (tdir / pid / "ranked_0.pdb").unlink()
    (tdir / pid / "ranked_0.pdb").symlink_to(secret)
    (tdir / "CURRENT").unlink()
    (tdir / "CURRENT").symlink_to(secret)
    (out / "targets" / "hb2").unlink()
    assert protdp_main(_args(ckpt, fasta, msas, out)) == 0
    capsys.readouterr()
    assert secret.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    rows = {r["target"]: r for r in read_summary(out / "summary.tsv")}
    assert rows["hb"]["status"] == rows["hb2"]["status"] == "predicted"
    ranked = tdir / pid / "ranked_0.pdb"
    assert not ranked.is_symlink() and ranked.read_text().startswith(("ATOM", "MODEL", "REMARK",
                                                                      "HEADER", "CRYST1"))
    assert [p for p in tdir.iterdir() if ".damaged-" in p.name]   # the linked one kept aside
    assert not (tdir / "CURRENT").is_symlink() and (tdir / "CURRENT").read_text().strip() == pid

    # the per-rank summary parts folder linked outside: refused before any work
    shutil.rmtree(out / ".summary_parts")
    (out / ".summary_parts").symlink_to(elsewhere, target_is_directory=True)
    assert protdp_main(_args(ckpt, fasta, msas, out)) == 2
    assert ".summary_parts is a symbolic link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []
    (out / ".summary_parts").unlink()

    # a finished prediction's PAE JSON truncated (a regular file now, but not the bytes
    # written): not done; redone, and a new queue binds the regenerated bytes, not the torn ones
    pae = tdir / pid / "AF-hb-F1-predicted_aligned_error_v4.json"
    whole = pae.read_bytes()
    pae.write_bytes(whole[: len(whole) // 2])
    queue = tmp_path / "new_queue.sqlite"
    assert protdp_main(_args(ckpt, fasta, msas, out, "--queue-url", f"sqlite:///{queue}")) == 0
    assert "2 need review" in capsys.readouterr().out
    assert json.loads(pae.read_text())[0]["chains"] and pae.read_bytes() == whole
    assert len([p for p in tdir.iterdir() if ".damaged-" in p.name]) == 2
    store = ReviewStore(f"sqlite:///{queue}")
    for item in store.list():
        assert mismatches(store.get(item["id"])) == []
    assert store.get(next(i["id"] for i in store.list() if i["target"] == "hb"))[
        "file_sha256"]["afdb_pae_json"] == hashlib.sha256(whole).hexdigest()
    store.close()


def test_complex_review_item_binds_the_bytes_the_reviewer_saw(tmp_path, ckpt, capsys):  # noqa: F811
    fasta, msas = _fasta(tmp_path)
    fasta.write_text(fasta.read_text().split(">hb2")[0])          # hb alone
    out = tmp_path / "out"
    queue = tmp_path / "queue.sqlite"
    store, admin, tokens = queue_with(str(queue), "alice")
    assert protdp_main(_args(ckpt, fasta, msas, out, "--queue-url",
                             f"sqlite:///{queue}")) == 0
    capsys.readouterr()
    [item] = store.list()
    pdir = out / "targets" / "hb" / (out / "targets" / "hb" / "CURRENT").read_text().strip()
    assert item["folder"] == str(pdir)
    assert {"ranked_0", "pae_json", "cif", "pdb", "scores"} <= set(item["file_sha256"])
    client = logged_in(create_app(store), tokens["alice"])
    page = client.get(f"/items/{item['id']}")
    assert page.status_code == 200 and 'id="files-changed"' not in page.text
    assert client.get(f"/items/{item['id']}/files/ranked_0").content == \
        (pdir / "ranked_0.pdb").read_bytes()
    # the sequence panel names each residue as the structure does (chain, number within the
    # chain: what a click selects in the 3D view), one chain label with its colour per chain
    pdb = gemmi.read_pdb_string(client.get(f"/items/{item['id']}/files/pdb").text)
    in_structure = {(ch.name, r.seqid.num): gemmi.find_tabulated_residue(r.name).one_letter_code
                    .upper() for ch in pdb[0] for r in ch}
    spans = re.findall(r'<span class="res[^"]*" data-chain="(\w)" data-resi="(\d+)" '
                       r'title="[^"]*">(\w)</span>', page.text)
    assert len(spans) == len(item["scores"]["sequence"]) == len(in_structure)
    assert all(in_structure[(c, int(n))] == aa for c, n, aa in spans)
    labels = re.findall(r'class="chain-label" data-chain="(\w)".*?fill="(#[0-9A-Fa-f]{6})"',
                        page.text)
    assert labels == [(c["chain_id"], c["color"]) for c in complex_view(item["scores"])["chains"]]
    assert client.get(f"/items/{item['id']}/pae.png").status_code == 200

    # the files change after enqueue (the PAE JSON edited, ranked_0 swapped for another model)
    saved = {n: (pdir / n).read_bytes() for n in ("ranked_0.pdb", "AF-hb-F1-predicted_aligned_error_v4.json",
                                                   "scores.json")}
    pae = json.loads(saved["AF-hb-F1-predicted_aligned_error_v4.json"])
    pae[0]["predicted_aligned_error"][0][40] = 0.0
    (pdir / "AF-hb-F1-predicted_aligned_error_v4.json").write_text(json.dumps(pae))
    (pdir / "ranked_0.pdb").write_bytes(saved["ranked_0.pdb"].replace(b" A ", b" B ", 1))
    page = client.get(f"/items/{item['id']}")
    banner = re.search(r'id="files-changed">(.*?)</p>', page.text, re.S).group(1)
    assert "afdb_pae_json: changed since enqueue" in banner and "ranked_0: changed since enqueue" \
        in banner
    assert f"/items/{item['id']}/files/ranked_0" not in page.text
    assert f"/items/{item['id']}/files/pdb" in page.text            # unchanged: still shown
    assert client.get(f"/items/{item['id']}/files/ranked_0").status_code == 409
    assert client.get(f"/items/{item['id']}/files/afdb_pae_json").status_code == 409
    assert client.get(f"/items/{item['id']}/files/pdb").status_code == 200
    csrf = csrf_of(client, f"/items/{item['id']}")
    refused = client.post(f"/items/{item['id']}/decide", data={
        "csrf_token": csrf, "action": "approve", "comment": ""}, follow_redirects=False)
    assert refused.status_code == 400 and "cannot approve item" in refused.text
    assert store.get(item["id"])["state"] == "pending"
    batch = client.post("/queue/batch", data={"csrf_token": csrf, "ids": [str(item["id"])],
                                              "action": "approve", "confirm_count": "1"})
    assert "its files changed since it was queued" in batch.text
    assert store.get(item["id"])["state"] == "pending"

    # the bytes restored: approved; a change after the approval keeps it out of the export
    for name, data in saved.items():
        (pdir / name).write_bytes(data)
    ok = client.post(f"/items/{item['id']}/decide", data={
        "csrf_token": csrf, "action": "approve", "comment": ""}, follow_redirects=False)
    assert ok.status_code == 303 and store.get(item["id"])["state"] == "approved"
    admin_tok = admin.add_reviewer("root", admin=True)
    kept, refused_records = trusted_records(store, admin_tok, require_bytes=True)
    assert [r["item_id"] for r in kept] == [item["id"]] and refused_records == []
    (pdir / "scores.json").write_bytes(saved["scores.json"].replace(b'"iptm"', b'"iptm" ', 1))
    kept, refused_records = trusted_records(store, admin_tok, require_bytes=True)
    assert kept == [] and "scores: changed since enqueue" in refused_records[0]["reason"]
    store.close()
