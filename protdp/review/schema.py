"""Tables of the review queue (SQLAlchemy Core), one definition for SQLite and PostgreSQL.

- `reviewers`: a name, the SHA-256 of its token (shown once), active and admin flags;
- `review_sessions`: web sessions (SHA-256 of the cookie value), ended by logout, expiry
  (database time) or removal of the reviewer;
- `review_items`: one flagged prediction each: what the gate said (`reasons`, `details`,
  `scores`), where its files are (`folder` plus bare file names in `paths`), and its state;
- `review_events`: the audit log (v3: decisions bind the item's digest, events are signed
  with the server key of `protdp.review.keys`), append-only (triggers refuse UPDATE/DELETE/TRUNCATE) and
  hash-chained (`seq`, `prev_hash`, `hash`; see `protdp.review.audit`).

`last_event_seq` on items and reviewers points at the newest event about the row, so deleting
the tail of the log leaves a dangling pointer that `protdp review verify` reports.
"""

from __future__ import annotations

from sqlalchemy import (JSON, Boolean, CheckConstraint, Column, Float, ForeignKey, Index, Integer,
                        MetaData, String, Table, Text)

SCHEMA_VERSION = 3
STATES = ("pending", "claimed", "approved", "rejected", "escalated")
FINAL_STATES = ("approved", "rejected", "escalated")
ACTIONS = {"approve": "approved", "reject": "rejected", "escalate": "escalated"}
ID_MAX = 2**31 - 1                     # ids are PostgreSQL `integer`
GENESIS_HASH = "0" * 64                # prev_hash of the first event
# Server-side limits (review_meta; an admin changes them with `protdp review set-limits`).
DEFAULT_LIMITS = {"default_lease_seconds": 900, "max_lease_seconds": 3600,
                  "max_claims_per_reviewer": 20,
                  # renewals end here: one claim holds an item at most this long in all
                  "max_hold_seconds": 4 * 3600}

metadata = MetaData()

review_meta = Table(
    "review_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
)

reviewers = Table(
    "reviewers", metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("active", Boolean, nullable=False),
    Column("is_admin", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("last_event_seq", Integer),
)

sessions = Table(
    "review_sessions", metadata,
    Column("id", Integer, primary_key=True),
    Column("token_sha256", String(64), nullable=False, unique=True),
    Column("reviewer", String(64), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("revoked_at", Float),
)

items = Table(
    "review_items", metadata,
    Column("id", Integer, primary_key=True),
    Column("prediction_id", String(500), nullable=False, unique=True),
    Column("target", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reasons", JSON, nullable=False),
    Column("reason_codes", Text, nullable=False),  # ",code1,code2," for portable LIKE filtering
    Column("details", JSON, nullable=False),
    Column("scores", JSON, nullable=False),
    Column("folder", Text),                        # the prediction's own folder (absolute)
    Column("paths", JSON, nullable=False),         # kind -> bare file name inside `folder`
    Column("mean_plddt", Float),
    Column("band", String(16)),                    # AFDB band of the mean, as the gate stored it
    Column("length", Integer),
    Column("msa_depth", Integer),
    Column("very_low_fraction", Float),
    Column("created_at", Float, nullable=False),
    Column("claimed_by", String(64)),
    Column("lease_expires_at", Float),
    Column("decided_by", String(64)),
    Column("decided_at", Float),
    Column("comment", Text),
    Column("last_event_seq", Integer),
    # v3: sha256 of every file of the item at enqueue (kind -> digest; "msa:<path>" for the MSA
    # files its provenance lists, "checkpoint" for the weights digest it names; None = absent)
    Column("file_sha256", JSON),
    Column("superseded_by", Integer),              # a newer item for the same target
    CheckConstraint("state IN ('pending', 'claimed', 'approved', 'rejected', 'escalated')",
                    name="review_items_state_ck"),
    Index("review_items_state_id", "state", "id"),
    Index("review_items_claimed_by", "claimed_by"),
)

events = Table(
    "review_events", metadata,
    Column("id", Integer, primary_key=True),
    Column("seq", Integer, nullable=False, unique=True),
    Column("item_id", Integer, ForeignKey("review_items.id"), index=True),
    Column("subject", String(64)),                 # the reviewer an admin event is about
    Column("at", Float, nullable=False),
    Column("actor", String(64), nullable=False),
    Column("action", String(32), nullable=False),
    Column("comment", Text),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    Column("bound_sha256", String(64)),            # v3: item digest a decision binds
    Column("mac", String(64)),                     # v3: HMAC(server key, hash); keys.py
)

APPEND_ONLY_DDL = {
    "sqlite": [
        "CREATE TRIGGER review_events_no_update BEFORE UPDATE ON review_events "
        "BEGIN SELECT RAISE(ABORT, 'review_events is append-only'); END",
        "CREATE TRIGGER review_events_no_delete BEFORE DELETE ON review_events "
        "BEGIN SELECT RAISE(ABORT, 'review_events is append-only'); END",
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION review_events_append_only() RETURNS trigger AS $$ "
        "BEGIN RAISE EXCEPTION 'review_events is append-only'; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER review_events_append_only BEFORE UPDATE OR DELETE ON review_events "
        "FOR EACH ROW EXECUTE FUNCTION review_events_append_only()",
        # row triggers do not fire on TRUNCATE: refuse it with a statement trigger
        "CREATE TRIGGER review_events_no_truncate BEFORE TRUNCATE ON review_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION review_events_append_only()",
    ],
}

# v3: rows are born harmless, for every role (a least-privilege role cannot drop triggers): an
# item is inserted pending, unclaimed and undecided; an event without a signature (the
# predictor's) can only be `enqueued` or `superseded`. A random `mac` gets past the trigger but
# not `protdp review verify`.
_ITEM_BORN_BAD = ("NEW.state <> 'pending' OR NEW.decided_by IS NOT NULL OR NEW.claimed_by IS "
                  "NOT NULL OR NEW.superseded_by IS NOT NULL")
_EVENT_BORN_BAD = "NEW.mac IS NULL AND NEW.action NOT IN ('enqueued', 'superseded')"
INSERT_GUARD_DDL = {
    "sqlite": [
        f"CREATE TRIGGER review_items_insert_pending BEFORE INSERT ON review_items WHEN "
        f"{_ITEM_BORN_BAD} BEGIN SELECT RAISE(ABORT, 'review items are inserted pending only'); "
        "END",
        f"CREATE TRIGGER review_events_insert_signed BEFORE INSERT ON review_events WHEN "
        f"{_EVENT_BORN_BAD} BEGIN SELECT RAISE(ABORT, 'an unsigned audit event may only be "
        "enqueued or superseded'); END",
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION review_items_insert_pending() RETURNS trigger AS $$ BEGIN "
        f"IF {_ITEM_BORN_BAD} THEN RAISE EXCEPTION 'review items are inserted pending only'; "
        "END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER review_items_insert_pending BEFORE INSERT ON review_items "
        "FOR EACH ROW EXECUTE FUNCTION review_items_insert_pending()",
        "CREATE OR REPLACE FUNCTION review_events_insert_signed() RETURNS trigger AS $$ BEGIN "
        f"IF {_EVENT_BORN_BAD} THEN RAISE EXCEPTION 'an unsigned audit event may only be "
        "enqueued or superseded'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER review_events_insert_signed BEFORE INSERT ON review_events "
        "FOR EACH ROW EXECUTE FUNCTION review_events_insert_signed()",
    ],
}
