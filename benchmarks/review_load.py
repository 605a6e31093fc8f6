"""Review queue under load: N concurrent reviewers through the real web server
(`protdp review serve`, uvicorn) on SQLite and on PostgreSQL, against the same workload
through the library directly (N processes holding reviewer tokens) as the peer.

Each web reviewer logs in (server-side session + CSRF, as a browser does) and loops:
POST /queue/claim-next -> GET /items/N (the workbench page) -> POST /items/N/decide, until
the queue is empty. Reported per configuration: decisions/s, p50/p99 latency of each request
and of the whole cycle, 503 "busy" retries, and the two invariants read back from the
database: 0 double claims (each item claimed once in the audit log, and by the reviewer whose
decision it carries) and 0 lost decisions (every 303 the clients saw is a decided item, every
item decided, `verify` ok). Absolute numbers on a shared 2-core machine are noise; compare
the web/direct ratios.

    python benchmarks/review_load.py [--reviewers 8 32] [--items 300] [--backends sqlite postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from protdp.paths import REPO_ROOT
from protdp.review.store import QueueBusy, ReviewStore

PG_URL = os.environ.get("PROTDP_TEST_PG_URL",
                        "postgresql://protdp:protdp@127.0.0.1:5432/protdp_test")
ACTIONS = ("approve", "reject", "escalate")
ACTIONS_DONE = ("approved", "rejected", "escalated")


# ------------------------------------------------------------------------------ queues

@contextmanager
def queue_url(backend: str, workdir: Path):
    """A fresh queue: a SQLite file, or a throwaway schema on the PostgreSQL server."""
    if backend == "sqlite":
        yield str(workdir / f"queue_{uuid.uuid4().hex[:6]}.sqlite")
        return
    base = make_url(PG_URL).set(drivername="postgresql+psycopg2")
    admin = create_engine(base)
    schema = f"protdp_bench_{uuid.uuid4().hex[:10]}"
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield make_url(PG_URL).update_query_dict(
            {"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def fill(url: str, n_reviewers: int, n_items: int) -> tuple[ReviewStore, list[str]]:
    """Queue with n_items gated predictions and n_reviewers reviewer tokens."""
    store = ReviewStore(url)
    admin = store.admin(store.init_admin())
    tokens = [admin.add_reviewer(f"rev{k}") for k in range(n_reviewers)]
    rng = np.random.default_rng(0)
    for i in range(n_items):
        plddt = np.clip(rng.normal(60, 15, 120), 0, 100).round(2)      # [L]
        store.enqueue(f"bench/{i}", f"target{i}", {
            "plddt": plddt.tolist(), "mean_plddt": float(plddt.mean()), "length": 120,
            "msa_depth": int(rng.integers(1, 300)), "very_low_fraction": float((plddt < 50).mean()),
            "sequence": "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), 120))},
            {}, ["low_mean_plddt"])
    return store, tokens


# ------------------------------------------------------------------------------ web clients

async def web_reviewer(base: str, token: str, k: int, out: dict) -> None:
    """One reviewer's session: claim next, open the item, decide; until the queue is empty."""
    lat = {"claim_next": [], "item_page": [], "decide": [], "cycle": []}
    decided, busy, errors = [], 0, []
    async with httpx.AsyncClient(base_url=base, timeout=120, follow_redirects=False) as c:
        page = await c.get("/login")
        login_csrf = re.search(r'name="login_csrf" value="(\w+)"', page.text).group(1)
        resp = await c.post("/login", data={"token": token, "login_csrf": login_csrf})
        assert resp.status_code == 303, resp.text
        csrf = re.search(r'name="csrf_token" value="(\w+)"', (await c.get("/queue")).text).group(1)

        async def timed(kind, method, path, **kw):
            nonlocal busy
            while True:
                t0 = time.perf_counter()
                r = await c.request(method, path, **kw)
                lat[kind].append(time.perf_counter() - t0)
                if r.status_code != 503:
                    return r
                busy += 1
                await asyncio.sleep(0.05)

        while True:
            t_cycle = time.perf_counter()
            r = await timed("claim_next", "POST", "/queue/claim-next", data={"csrf_token": csrf})
            where = r.headers.get("location", "")
            if r.status_code != 303 or "empty=1" in where:
                if r.status_code != 303:
                    errors.append(f"claim-next {r.status_code}")
                break
            item_id = int(where.rsplit("/", 1)[1])
            r = await timed("item_page", "GET", where)
            if r.status_code != 200:
                errors.append(f"item page {r.status_code}")
            action = ACTIONS[item_id % 3]
            r = await timed("decide", "POST", f"{where}/decide", data={
                "csrf_token": csrf, "action": action, "comment": f"{action} by rev{k}"})
            if r.status_code == 303:
                decided.append(item_id)
            else:
                errors.append(f"decide {item_id}: {r.status_code}")
            lat["cycle"].append(time.perf_counter() - t_cycle)
    out[k] = {"decided": decided, "latency": lat, "busy": busy, "errors": errors}


def serve(url: str, workdir: Path):
    port = _free_port()
    log = open(workdir / f"server_{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "protdp.cli", "review", "serve", "--queue-url",
                             url, "--port", str(port)], cwd=REPO_ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).text == "ok":
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("review server did not come up")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_web(url: str, tokens: list[str], workdir: Path) -> dict:
    proc, base = serve(url, workdir)
    out: dict[int, dict] = {}
    try:
        t0 = time.perf_counter()

        async def everyone():
            await asyncio.gather(*(web_reviewer(base, tok, k, out) for k, tok in enumerate(tokens)))

        asyncio.run(everyone())
        seconds = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    return {"seconds": seconds, "clients": out}


# ------------------------------------------------------------------------------ direct peer

def direct_worker(url: str, token: str, barrier, out_path: str) -> None:
    store = ReviewStore(url)
    rev = store.reviewer(token)
    decided, busy = [], 0
    barrier.wait()
    while True:
        try:
            item = rev.claim()
            if item is None:
                break
            rev.decide(item["id"], ACTIONS[item["id"] % 3], "direct")
            decided.append(item["id"])
        except QueueBusy:
            busy += 1
    store.close()
    Path(out_path).write_text(json.dumps({"decided": decided, "busy": busy, "name": rev.name}))


def run_direct(url: str, tokens: list[str], workdir: Path) -> dict:
    ctx = mp.get_context("forkserver")
    barrier = ctx.Barrier(len(tokens) + 1)
    outs = [workdir / f"direct_{k}.json" for k in range(len(tokens))]
    procs = [ctx.Process(target=direct_worker, args=(url, tok, barrier, str(o)))
             for tok, o in zip(tokens, outs)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    for p in procs:
        p.join(600)
    seconds = time.perf_counter() - t0
    results = [json.loads(o.read_text()) for o in outs]
    return {"seconds": seconds, "decided": [i for r in results for i in r["decided"]],
            "decided_by": {i: r["name"] for r in results for i in r["decided"]},
            "busy": sum(r["busy"] for r in results)}


# ------------------------------------------------------------------------------ checks

def invariants(store: ReviewStore, decided_by: dict[int, str], n_items: int) -> dict:
    """Double claims and lost decisions, read back from the database and the audit log."""
    claims: dict[int, int] = {}
    for ev in store.events():
        if ev["action"] == "claimed":
            claims[ev["item_id"]] = claims.get(ev["item_id"], 0) + 1
    rows = {i["id"]: i for i in store.list("all", limit=n_items + 10)}
    double = sum(1 for n in claims.values() if n > 1) + sum(
        1 for i, who in decided_by.items() if rows[i]["decided_by"] != who)
    lost = sum(1 for i in decided_by if rows[i]["state"] not in ACTIONS_DONE) + \
        sum(1 for r in rows.values() if r["state"] not in ACTIONS_DONE)
    return {"double_claims": double, "lost_decisions": lost,
            "decided_in_db": sum(1 for r in rows.values() if r["state"] in ACTIONS_DONE),
            "audit_verified": store.verify()["ok"]}


def pct(values: list[float]) -> dict:
    arr = np.array(values) * 1000.0
    return {"n": len(arr), "p50_ms": round(float(np.percentile(arr, 50)), 2),
            "p99_ms": round(float(np.percentile(arr, 99)), 2)} if len(arr) else {"n": 0}


def one_config(backend: str, n_reviewers: int, n_items: int, workdir: Path) -> dict:
    with queue_url(backend, workdir) as url:
        store, tokens = fill(url, n_reviewers, n_items)
        web = run_web(url, tokens, workdir)
        decided_by = {i: f"rev{k}" for k, c in web["clients"].items() for i in c["decided"]}
        n_decided = sum(len(c["decided"]) for c in web["clients"].values())
        lat = {kind: pct([x for c in web["clients"].values() for x in c["latency"][kind]])
               for kind in ("claim_next", "item_page", "decide", "cycle")}
        web_res = {"seconds": round(web["seconds"], 3), "decisions": n_decided,
                   "decisions_per_s": round(n_decided / web["seconds"], 2), "latency": lat,
                   "busy_503_retries": sum(c["busy"] for c in web["clients"].values()),
                   "errors": [e for c in web["clients"].values() for e in c["errors"]],
                   "decisions_repeated": n_decided - len(decided_by),
                   **invariants(store, decided_by, n_items)}
        store.close()
    with queue_url(backend, workdir) as url:
        store, tokens = fill(url, n_reviewers, n_items)
        direct = run_direct(url, tokens, workdir)
        d_by = direct["decided_by"]
        direct_res = {"seconds": round(direct["seconds"], 3), "decisions": len(direct["decided"]),
                      "decisions_per_s": round(len(direct["decided"]) / direct["seconds"], 2),
                      "busy_retries": direct["busy"],
                      "decisions_repeated": len(direct["decided"]) - len(d_by),
                      **invariants(store, d_by, n_items)}
        store.close()
    return {"backend": backend, "reviewers": n_reviewers, "items": n_items, "web": web_res,
            "direct": direct_res,
            "web_over_direct_throughput": round(web_res["decisions_per_s"]
                                                / direct_res["decisions_per_s"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reviewers", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--items", type=int, default=300)
    ap.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    ap.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/review_load.json"))
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    configs = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            for n in args.reviewers:
                res = one_config(backend, n, args.items, Path(tmp))
                w = res["web"]
                print(f"{backend:<10} {n:>3} reviewers: web {w['decisions_per_s']:7.1f} dec/s, "
                      f"cycle p99 {w['latency']['cycle'].get('p99_ms')} ms, double claims "
                      f"{w['double_claims']}, lost {w['lost_decisions']}; direct "
                      f"{res['direct']['decisions_per_s']:7.1f} dec/s "
                      f"(web/direct {res['web_over_direct_throughput']})", flush=True)
                configs.append(res)
    result = {"benchmark": "review_load",
              "workload": "per decision: POST /queue/claim-next, GET /items/N, POST decide "
                          "(cookie session + CSRF); peer: ReviewStore reviewer tokens in N "
                          "processes (claim + decide)",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_avg_1m_before": load_before,
                          "load_avg_1m_after": os.getloadavg()[0]},
              "configs": configs,
              "ok": all(c[side]["double_claims"] == 0 and c[side]["lost_decisions"] == 0
                        for c in configs for side in ("web", "direct"))}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}; invariants {'hold' if result['ok'] else 'BROKEN'}")


if __name__ == "__main__":
    main()
