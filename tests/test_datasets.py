"""Dataset recipes (datasets/assemble_corpus.py) against local mirrors laid out like the wwPDB
and OpenProteinSet archives, built in a temp dir from ../shared/data: a 127.0.0.1 HTTP server
(with Range support and injected faults: a connection dropped mid-file, corrupted bytes, a
process killed mid-download) and a file:// mirror. The manifest must build a store with
`protdp data build --pairs`; the shared-data checksum list must still verify."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import gemmi
import pytest

from protdp.cli import main as protdp_main
from protdp.data.store import FamilyStore
from protdp.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "datasets"))
import assemble_corpus  # noqa: E402
import pdb_mmcif  # noqa: E402

RECIPE = REPO_ROOT / "datasets" / "assemble_corpus.py"
IDS = ("102m", "2q2k", "4hhb", "5zyh")
# OpenProteinSet-style files made from the corpus MSAs whose query is that chain (PAIRS.tsv;
# the 1a00_A MSAs were computed for the hemoglobin alpha chain, 4HHB chain A)
MSAS = {"102m_A/a3m/uniref90_hits.a3m": "msa/102m_A.colabfold.a3m",
        "2q2k_A/a3m/bfd_uniclust_hits.a3m": "msa/2q2k_A.bfd_uniclust.a3m",
        "4hhb_A/a3m/mgnify_hits.a3m": "msa/1a00_A.mgnify.a3m",
        "4hhb_B/a3m/uniref90_hits.a3m": "msa/4hhb_B.colabfold.a3m",
        "5zyh_A/a3m/uniref90_hits.a3m": "msa/5zyh_A.colabfold.a3m"}
EXTRA_ENTRIES = ("1k1a", "7zzx")     # in the index only: for the date/resolution filter


def _idx_line(cif: Path) -> str:
    block = gemmi.cif.read(str(cif))[0]
    y, m, d = block.find_value("_pdbx_database_status.recvd_initial_deposition_date").split("-")
    res = block.find_value("_refine.ls_d_res_high") or "NOT"
    method = gemmi.cif.as_string(block.find_value("_exptl.method"))
    return f"{cif.stem.upper()}\tPROTEIN\t{m}/{d}/{y[2:]}\tx\tx\tx\t{res}\t{method}"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, data_dir):
    """A folder laid out like both archives, plus the sha256 lists an archive would publish."""
    root = tmp_path_factory.mktemp("mirror")
    sums = {"pdb": [], "msa": []}
    for pid in IDS + EXTRA_ENTRIES:
        rel = pdb_mmcif.entry_path(pid)
        dest = root / "wwpdb" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(gzip.compress((data_dir / "structures" / f"{pid}.cif").read_bytes()))
        sums["pdb"].append(f"{hashlib.sha256(dest.read_bytes()).hexdigest()}  {rel}")
    index = root / "wwpdb" / pdb_mmcif.INDEX_PATH
    index.parent.mkdir(parents=True)
    index.write_text("IDCODE, HEADER, ACCESSION DATE, COMPOUND, SOURCE, AUTHOR LIST, RESOLUTION, "
                     "EXPERIMENT TYPE\n------\n" + "\n".join(
                         _idx_line(data_dir / "structures" / f"{p}.cif")
                         for p in IDS + EXTRA_ENTRIES) + "\n")
    for rel, src in MSAS.items():
        dest = root / "ops" / "pdb" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((data_dir / src).read_bytes())
        sums["msa"].append(f"{hashlib.sha256(dest.read_bytes()).hexdigest()}  pdb/{rel}")
    for kind, lines in sums.items():
        (root / f"{kind}.sha256").write_text("\n".join(lines) + "\n")
    (root / "ids.txt").write_text("# entries\n" + "\n".join(IDS) + "\n")
    return root


class _Handler(http.server.BaseHTTPRequestHandler):
    """Static files with Range; `faults[path]` is a list of actions for the next requests:
    'drop' (half the body, then close), 'corrupt' (bytes flipped), 'stall' (half, then hang)."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        rel = unquote(urlparse(self.path).path).lstrip("/")
        path = (srv.root / rel).resolve()
        srv.requests.append((rel, self.headers.get("Range")))
        if srv.root not in path.parents or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start, status = 0, 200
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if m:
            start, status = int(m.group(1)), 206
            if start >= len(data):
                self.send_error(416)
                return
        body = data[start:]
        action = srv.faults.get(rel, []).pop(0) if srv.faults.get(rel) else None
        if action in ("endless", "trickle"):          # no Content-Length; never ends
            self.send_response(200)
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"x" * (1 << 16) if action == "endless" else b"x")
                    self.wfile.flush()
                    if action == "trickle":
                        time.sleep(0.2)
            except OSError:
                return
        if action == "range_from_zero" and status == 206:   # a 206 that ignores the Range
            body, start = data, 0
        if action == "corrupt":
            body = bytes(b ^ 0x5A for b in body[:64]) + body[64:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if action in ("drop", "stall"):
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            if action == "stall":
                time.sleep(60)
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def server(mirror):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.root, srv.faults, srv.requests = mirror.resolve(), {}, []
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def _args(srv_url, mirror, out, *extra):
    return ["all", "--out", str(out), "--ids", str(mirror / "ids.txt"),
            "--pdb-base", f"{srv_url}/wwpdb", "--msa-base", f"{srv_url}/ops",
            "--pdb-checksums", str(mirror / "pdb.sha256"),
            "--msa-checksums", str(mirror / "msa.sha256"), "--workers", "3", *extra]


def test_assemble_over_http_with_faults_then_build_store(server, mirror, data_dir, tmp_path,
                                                         capsys):
    drop = pdb_mmcif.entry_path("102m")
    server.faults = {f"wwpdb/{drop}": ["drop"],
                     f"wwpdb/{pdb_mmcif.entry_path('5zyh')}": ["corrupt"],
                     "ops/pdb/5zyh_A/a3m/uniref90_hits.a3m": ["corrupt"]}
    out = tmp_path / "corpus"
    assert assemble_corpus.main(_args(server.url, mirror, out)) == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["failed"] == [] and report["fetched"] == len(IDS) + len(MSAS)
    assert report["resumed"] == 1 and report["refetched_after_error"] == 3
    assert any(r == f"wwpdb/{drop}" and rng and rng != "bytes=0-" for r, rng in server.requests)
    missing = sorted(m["item"] for m in report["missing"])
    assert "4hhb_C/uniref90_hits.a3m" in missing and "2q2k_B/bfd_uniclust_hits.a3m" in missing
    for pid in IDS:                        # unpacked, byte-identical to the source entry
        assert (out / "mmcif" / f"{pid}.cif").read_bytes() == \
            (data_dir / "structures" / f"{pid}.cif").read_bytes()
    assert not list(out.rglob("*.part")) and not list(out.rglob(".*.gz"))
    check = subprocess.run(["sha256sum", "-c", "--quiet", "checksums.sha256"], cwd=out,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert len((out / "checksums.sha256").read_text().splitlines()) == len(IDS) + len(MSAS)

    pairs = (out / "pairs.tsv").read_text().splitlines()
    assert pairs[0] == "pair_id\tmsa_file\tstructure_file\tchain" and len(pairs) == 1 + len(MSAS)
    store_path = tmp_path / "data.h5"
    capsys.readouterr()
    assert protdp_main(["data", "build", "--pairs", str(out / "pairs.tsv"), "--out",
                        str(store_path), "--no-progress"]) == 0
    store = FamilyStore(store_path)
    assert sorted(store.family_ids) == sorted(k.split("/")[0] for k in MSAS)

    # a rerun fetches nothing; a file damaged on disk since is fetched again
    server.requests.clear()
    cif = out / "mmcif" / "2q2k.cif"
    cif.write_bytes(cif.read_bytes()[:-100])
    assert assemble_corpus.main(_args(server.url, mirror, out)) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["fetched"] == 1 and report["skipped"] == len(IDS) + len(MSAS) - 1
    assert cif.read_bytes() == (data_dir / "structures" / "2q2k.cif").read_bytes()
    fetched = {r for r, _ in server.requests}
    assert f"wwpdb/{pdb_mmcif.entry_path('2q2k')}" in fetched
    assert f"wwpdb/{pdb_mmcif.entry_path('102m')}" not in fetched


def test_persistent_corruption_is_reported_and_the_rest_kept(server, mirror, tmp_path, capsys):
    bad = "ops/pdb/4hhb_B/a3m/uniref90_hits.a3m"
    server.faults = {bad: ["corrupt"] * 10}
    out = tmp_path / "corpus"
    assert assemble_corpus.main(_args(server.url, mirror, out, "--retries", "2")) == 1
    err = capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert [f["item"] for f in report["failed"]] == ["4hhb_B/uniref90_hits.a3m"]
    assert "sha256" in report["failed"][0]["reason"] and "4hhb_B" in err
    assert sum(1 for r, _ in server.requests if r == bad) == 3
    assert not (out / "msas" / "4hhb_B" / "uniref90_hits.a3m").exists()
    rows = (out / "pairs.tsv").read_text().splitlines()[1:]
    assert len(rows) == len(MSAS) - 1 and not any(r.startswith("4hhb_B") for r in rows)


def test_killed_mid_download_resumes_with_range(server, mirror, tmp_path):
    """kill -9 while a file is half written: the rerun asks only for the missing bytes."""
    stall = f"wwpdb/{pdb_mmcif.entry_path('4hhb')}"
    server.faults = {stall: ["stall"]}
    out = tmp_path / "corpus"
    cmd = [sys.executable, str(RECIPE), *_args(server.url, mirror, out, "--workers", "1")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = out / "mmcif" / ".4hhb.cif.gz.part"
    deadline = time.time() + 60
    while not (part.exists() and part.stat().st_size > 0) and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    size = part.stat().st_size
    assert size > 0 and not (out / "mmcif" / "4hhb.cif").exists()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert (stall, f"bytes={size}-") in server.requests
    assert json.loads((out / "report.json").read_text())["resumed"] == 1


def test_filters_over_a_file_mirror(mirror, tmp_path, data_dir):
    """file:// archive; entries chosen from entries.idx by deposition date and resolution."""
    out = tmp_path / "corpus"
    base = (mirror / "wwpdb").as_uri()
    rc = assemble_corpus.main(["pdb", "--out", str(out), "--pdb-base", base,
                               "--deposited-after", "1990-01-01", "--deposited-before",
                               "2020-12-31", "--max-resolution", "2.0", "--workers", "2"])
    assert rc == 0
    expected = []
    for pid in IDS + EXTRA_ENTRIES:     # the same rule, from the entries' own mmCIF fields
        block = gemmi.cif.read(str(data_dir / "structures" / f"{pid}.cif"))[0]
        date = block.find_value("_pdbx_database_status.recvd_initial_deposition_date")
        res = float(block.find_value("_refine.ls_d_res_high"))
        if "1990-01-01" <= date <= "2020-12-31" and res <= 2.0:
            expected.append(pid)
    assert sorted(p.stem for p in (out / "mmcif").glob("*.cif")) == sorted(expected)
    assert set(expected) == {"102m", "5zyh", "1k1a"}


def test_bad_usage_is_one_line(tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text("102m\nnot-an-id\n")
    assert assemble_corpus.main(["pdb", "--out", str(tmp_path / "c"), "--ids", str(ids),
                                 "--pdb-base", tmp_path.as_uri()]) == 2
    err = capsys.readouterr().err
    assert "ids.txt:2" in err and "not a 4-character PDB id" in err and "Traceback" not in err
    assert assemble_corpus.main(["all", "--out", str(tmp_path / "c")]) == 2
    assert "refusing to fetch the whole PDB" in capsys.readouterr().err


def test_shared_data_checksums_still_verify(data_dir):
    res = subprocess.run(["sha256sum", "-c", "--quiet", str(REPO_ROOT / "datasets" /
                                                             "shared_data.sha256")],
                         cwd=data_dir, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def test_hostile_mirror_is_bounded_and_checked(server, mirror, tmp_path, capsys):
    """Issue 28: an endless body stops at the size cap, a trickle at the per-file deadline, a 206
    whose Content-Range starts at 0 restarts the file instead of being appended, a gzip bomb
    and an atom-less mmCIF fail the content check, an endless entries.idx stops at its cap, and
    a run where every download was a 404 exits non-zero."""
    import fetch as fetch_mod
    rel = "wwpdb/" + pdb_mmcif.entry_path(IDS[0])
    url = f"{server.url}/{rel}"
    dest = tmp_path / "x.gz"
    server.faults[rel] = ["endless"]
    with pytest.raises(fetch_mod.FetchError, match="download cap"):
        fetch_mod.fetch(url, dest, max_bytes=1 << 20, retries=0)
    assert not dest.with_name("x.gz.part").exists()
    server.faults[rel] = ["trickle"]
    t0 = time.monotonic()
    with pytest.raises(fetch_mod.FetchError, match="not finished after 1 s"):
        fetch_mod.fetch(url, dest, deadline=1.0, retries=0)
    assert time.monotonic() - t0 < 30
    whole = (mirror / rel).read_bytes()
    part = dest.with_name("x.gz.part")
    part.write_bytes(whole[: len(whole) // 2])
    server.faults[rel] = ["range_from_zero"]
    got = fetch_mod.fetch(url, dest, check=pdb_mmcif.check_cif_gz, retries=0)
    assert dest.read_bytes() == whole and not got.resumed
    bomb = tmp_path / "bomb.cif.gz"
    bomb.write_bytes(gzip.compress(b"data_x\n_entry.id x\n" + b"#" * (4 << 20)))
    with pytest.raises(ValueError, match="decompresses to more than 1 MiB"):
        pdb_mmcif.check_cif_gz(bomb, max_bytes=1 << 20)
    bomb.write_bytes(gzip.compress(b"data_x\n_entry.id x\n"))
    with pytest.raises(ValueError, match="no atoms"):
        pdb_mmcif.check_cif_gz(bomb)
    index = "wwpdb/" + pdb_mmcif.INDEX_PATH
    server.faults[index] = ["endless"]
    with pytest.raises(fetch_mod.FetchError, match="cap for an index"):
        fetch_mod.read_url_text(f"{server.url}/{index}", max_bytes=1 << 20)
    rc = assemble_corpus.main(["pdb", "--out", str(tmp_path / "c"), "--ids",
                               str(mirror / "ids.txt"), "--pdb-base", f"{server.url}/nowhere",
                               "--retries", "0"])
    assert rc == 1 and "nothing was fetched" in capsys.readouterr().err
