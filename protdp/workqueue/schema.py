"""Tables of the work queue (SQLAlchemy Core; created on first use, SQLite and PostgreSQL alike).

work_runs   one row per run: `run_key` (a digest of what the run computes: output folder,
            inputs, settings), its `generation` (bumped, at `started_at`, when a finished run
            is started again: every item is then verified afresh) and the number of items.
work_items  one row per (run, item): the item's `idx` in the input, `name`, `cost` (claim
            order: largest first), `state` (todo / running / done / failed), who holds it
            (`owner` = host:pid[@node], `rank`, `host`, `pid`, `node`: where that pid is valid),
            since when (`claimed_at`), until when
            (`lease_until`, database clock), `attempts`, `finished_at`, and the result row
            (`result`, JSON text) from which the run's summary is written.
"""

from __future__ import annotations

from sqlalchemy import (Column, Float, Index, Integer, MetaData, PrimaryKeyConstraint, String,
                        Table, Text)

TODO, RUNNING, DONE, FAILED = "todo", "running", "done", "failed"
STATES = (TODO, RUNNING, DONE, FAILED)
FINAL_STATES = (DONE, FAILED)

metadata = MetaData()

runs = Table(
    "work_runs", metadata,
    Column("run_key", String(64), primary_key=True),
    Column("generation", Integer, nullable=False),
    Column("total", Integer, nullable=False),
    Column("label", Text, nullable=False),
    Column("started_at", Float, nullable=False),
)

items = Table(
    "work_items", metadata,
    Column("run_key", String(64), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("name", Text, nullable=False),
    Column("cost", Float, nullable=False),
    Column("state", String(8), nullable=False),
    Column("owner", Text),
    Column("rank", Integer),
    Column("host", Text),
    Column("pid", Integer),
    Column("node", Text),          # machine + pid namespace of `pid` (queue.node_id)
    Column("claimed_at", Float),
    Column("lease_until", Float),
    Column("attempts", Integer, nullable=False, default=0),
    Column("finished_at", Float),
    Column("result", Text),
    PrimaryKeyConstraint("run_key", "idx"),
    Index("work_items_claim", "run_key", "state", "cost"),
)
