"""PostgreSQL privileges for the queue (`protdp review init-db --app-role/--enqueue-role`).

Run init-db as the database owner (the role that creates the tables). It grants:

- the application role (web server, `protdp review` for reviewers and admins): read
  everything; INSERT/UPDATE on reviewers, items, sessions and limits; INSERT and SELECT only
  on `review_events`, with UPDATE, DELETE and TRUNCATE explicitly revoked, so the audit log
  cannot be rewritten or emptied through it (the triggers refuse UPDATE/DELETE/TRUNCATE for
  every role as well, the owner included, until someone drops them);
- the enqueue role (`protdp predict`): INSERT and SELECT on items and events, and UPDATE of
  nothing but `review_items.last_event_seq` (the audit pointer enqueue maintains) and
  `superseded_by` (a newer prediction of the same target; its events are unsigned and can
  only ever take an item out of review, never approve one).

Grants say which tables a role may write; what it may write is bounded by the insert triggers
of `protdp.review.schema` (items are born pending, unsigned events can only enqueue) and by the
audit key (`protdp.review.keys`), which no database role holds: a row or event written with a
database credential alone authorises nothing and fails `protdp review verify`.

Both roles must exist already (`CREATE ROLE protdp_app LOGIN PASSWORD '...'`).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from protdp.review.errors import QueueError

_SEQUENCES = ("reviewers_id_seq", "review_items_id_seq", "review_events_id_seq",
              "review_sessions_id_seq")

APP_GRANTS = [
    "GRANT SELECT, INSERT, UPDATE ON review_meta, reviewers, review_items TO {r}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON review_sessions TO {r}",
    "GRANT SELECT, INSERT ON review_events TO {r}",
    "REVOKE UPDATE, DELETE, TRUNCATE ON review_events FROM {r}",
    "REVOKE DELETE, TRUNCATE ON review_meta, reviewers, review_items FROM {r}",
]
ENQUEUE_GRANTS = [
    "GRANT SELECT ON review_meta TO {r}",
    "GRANT SELECT, INSERT ON review_items, review_events TO {r}",
    "GRANT UPDATE (last_event_seq, superseded_by) ON review_items TO {r}",
    "REVOKE UPDATE, DELETE, TRUNCATE ON review_events FROM {r}",
]


def grant(conn: Connection, role: str, kind: str) -> list[str]:
    """Apply the grants of `kind` ("app" or "enqueue") to `role`; returns the SQL run."""
    if conn.dialect.name != "postgresql":
        raise QueueError("database roles exist only on PostgreSQL (a SQLite queue is guarded "
                         "by file permissions)")
    if not conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
        raise QueueError(f"PostgreSQL role '{role}' does not exist; create it first: "
                         f"CREATE ROLE {role} LOGIN PASSWORD '...'")
    quote = conn.dialect.identifier_preparer.quote
    r = quote(role)
    schema = conn.execute(text("SELECT current_schema()")).scalar()
    statements = [f"GRANT USAGE ON SCHEMA {quote(schema)} TO {r}"]
    statements += [s.format(r=r) for s in (APP_GRANTS if kind == "app" else ENQUEUE_GRANTS)]
    statements.append(f"GRANT USAGE, SELECT ON SEQUENCE {', '.join(_SEQUENCES)} TO {r}")
    for sql in statements:
        conn.exec_driver_sql(sql)
    return statements
