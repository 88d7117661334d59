"""What the worker does differently per database: the only vendor checks in the worker package."""

from __future__ import annotations


def deletes_with_claim(vendor: str) -> bool:
    """Whether the dispatcher deletes succeeded jobs in its next claim's transaction.

    SQLite allows one writer at a time: a commit and a turn at the write lock fewer per batch
    drain faster. PostgreSQL and MariaDB drain faster with the deletes beside the claims, on the
    completer's connection (docs/design.md, "Recording outcomes").
    """
    return vendor == "sqlite"


def wakeup_kind(vendor: str) -> str:
    """How an idle worker learns of new jobs before its poll interval ends, besides in-process
    enqueues: "listen" (PostgreSQL NOTIFY), "data_version" (SQLite's PRAGMA data_version) or
    "poll" (nothing more)."""
    return {"postgresql": "listen", "sqlite": "data_version"}.get(vendor, "poll")
