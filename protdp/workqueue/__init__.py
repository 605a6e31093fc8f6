"""A leased work queue (SQLite or PostgreSQL through SQLAlchemy): processes of one run claim
items costliest first, renew a lease while they work, and record each item's result once; an
item whose process died is claimed again when its lease runs out. `protdp predict` deals its
targets through it (`protdp.inference.batch`)."""

from protdp.workqueue.engine import Engine, WorkQueueError, normalize_url
from protdp.workqueue.lease import Heartbeat, drain
from protdp.workqueue.queue import DEFAULT_LEASE_S, WorkItem, WorkQueue, Worker
from protdp.workqueue.status import format_status, run_status

__all__ = ["DEFAULT_LEASE_S", "Engine", "Heartbeat", "WorkItem", "WorkQueue", "WorkQueueError",
           "Worker", "drain", "format_status", "normalize_url", "run_status"]
