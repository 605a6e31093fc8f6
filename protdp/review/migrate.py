"""Schema migrations of the review queue, applied in the opening transaction.

v1 -> v2: reviewers gain admin flags; items gain their prediction folder (absolute file paths
become the folder plus bare names), the stored AFDB band and the features the gate and the
reviewed calibration use; web sessions move server-side; the audit log is rebuilt as a hash
chain over the v1 events in their original order (times, actors and comments kept), followed
by one `reviewer_added` (and `reviewer_removed`) event per existing reviewer. Nothing is lost:
an item whose files were not in one folder keeps its paths in `details["v1_paths"]`.

v2 -> v3: items gain `file_sha256` (None for old items: they were enqueued without file digests
and so are never exported as reviewed) and `superseded_by`; events gain `bound_sha256` and `mac`,
and every existing event is signed with the audit key created now (trust on first use: run the
migration, i.e. `protdp review init-db`, as the administrator, then `verify`).
"""

from __future__ import annotations

from sqlalchemy import inspect, select, text, update
from sqlalchemy.engine import Connection

from protdp.errors import InputError
from protdp.gating import band_of
from protdp.review import audit, keys
from protdp.review.files import split_paths
from protdp.review.schema import (APPEND_ONLY_DDL, DEFAULT_LIMITS, INSERT_GUARD_DDL,
                                  SCHEMA_VERSION, events, items, review_meta, reviewers, sessions)

_V2_ITEM_COLUMNS = {"folder": "TEXT", "band": "VARCHAR(16)", "length": "INTEGER",
                    "msa_depth": "INTEGER", "very_low_fraction": "FLOAT",
                    "last_event_seq": "INTEGER"}


def _v1_to_v2(db, conn: Connection) -> None:
    false = "false" if db.dialect == "postgresql" else "0"
    conn.exec_driver_sql(f"ALTER TABLE reviewers ADD COLUMN is_admin BOOLEAN NOT NULL "
                         f"DEFAULT {false}")
    conn.exec_driver_sql("ALTER TABLE reviewers ADD COLUMN last_event_seq INTEGER")
    for name, sql_type in _V2_ITEM_COLUMNS.items():
        conn.exec_driver_sql(f"ALTER TABLE review_items ADD COLUMN {name} {sql_type}")
    if not inspect(conn).has_table("review_sessions"):
        sessions.create(conn)
    old_events = [dict(r) for r in conn.execute(
        text("SELECT item_id, at, actor, action, comment FROM review_events ORDER BY id"))
        .mappings()]
    conn.exec_driver_sql("DROP TABLE review_events")  # triggers go with it
    events.create(conn)
    for ddl in APPEND_ONLY_DDL[db.dialect]:
        conn.exec_driver_sql(ddl)
    for row in conn.execute(select(items.c.id, items.c.paths, items.c.scores, items.c.details,
                                   items.c.mean_plddt)).all():
        scores = row.scores or {}
        try:
            folder, names = split_paths(row.paths or {})
            details = row.details
        except InputError:
            folder, names, details = None, {}, {**(row.details or {}), "v1_paths": row.paths}
        length = scores.get("length") or (len(scores["plddt"]) if isinstance(
            scores.get("plddt"), list) else None)
        conn.execute(update(items).where(items.c.id == row.id).values(
            folder=folder, paths=names, details=details, length=length,
            band=None if row.mean_plddt is None else band_of(row.mean_plddt),
            msa_depth=scores.get("msa_depth"), very_low_fraction=scores.get("very_low_fraction")))
    now = db.now(conn)
    log = [{**e, "subject": None} for e in old_events]
    for r in conn.execute(select(reviewers).order_by(reviewers.c.id)).mappings():
        log.append({"subject": r["name"], "actor": "migration", "action": "reviewer_added",
                    "comment": f"token sha256 {r['token_sha256']}", "at": r["created_at"]})
        if not r["active"]:
            log.append({"subject": r["name"], "actor": "migration",
                        "action": "reviewer_removed", "comment": None})
    audit.append(db, conn, now, log)
    conn.execute(review_meta.insert(), [{"key": k, "value": str(v)}
                                        for k, v in DEFAULT_LIMITS.items()])


def _v2_to_v3(db, conn: Connection) -> None:
    new_columns = {"review_items": {"file_sha256": "JSON", "superseded_by": "INTEGER"},
                   "review_events": {"bound_sha256": "VARCHAR(64)", "mac": "VARCHAR(64)"}}
    for table, columns in new_columns.items():
        have = {c["name"] for c in inspect(conn).get_columns(table)}
        for name, sql_type in columns.items():
            if name not in have:    # a v1 queue's log was rebuilt with v3 columns already
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}")
    key = db.ensure_key(conn)
    # the append-only triggers refuse the one-time signing UPDATE: lift them for it
    if db.dialect == "sqlite":
        conn.exec_driver_sql("DROP TRIGGER review_events_no_update")
    else:
        conn.exec_driver_sql("DROP TRIGGER review_events_append_only ON review_events")
    for row in conn.execute(select(events.c.id, events.c.hash)).all():
        conn.execute(update(events).where(events.c.id == row.id)
                     .values(mac=keys.mac(key, row.hash)))
    conn.exec_driver_sql(APPEND_ONLY_DDL[db.dialect][0 if db.dialect == "sqlite" else 1])
    for ddl in INSERT_GUARD_DDL[db.dialect]:
        conn.exec_driver_sql(ddl)


def migrate(db, conn: Connection, found: int) -> None:
    """Bring a queue at schema `found` to SCHEMA_VERSION inside `conn`'s transaction."""
    steps = {1: _v1_to_v2, 2: _v2_to_v3}
    for version in range(found, SCHEMA_VERSION):
        steps[version](db, conn)
    conn.execute(update(review_meta).where(review_meta.c.key == "schema_version")
                 .values(value=str(SCHEMA_VERSION)))
