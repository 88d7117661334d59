"""The SQL of the hot path: claim, finish (fenced), renew, hand back, recover.

Raw SQL on purpose: these statements run for every job, and each must be one round trip where
the database allows it. What differs between databases is kept here, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from django.db.backends.base.base import BaseDatabaseWrapper

from .db import atomic
from .models import Job, Status

CLAIM_COLUMNS = (
    "id, job_type, payload, queue, priority, attempts, max_retries, next_run_at, created_at, unique_key"
)
ORDER = "priority DESC, next_run_at ASC, created_at ASC, id ASC"


@dataclass
class Claimed:
    """A job this worker holds, with the token that fences its outcome."""

    id: str
    job_type: str
    payload: str
    queue: str
    priority: int
    attempts: int
    max_retries: int
    next_run_at: int
    created_at: int
    unique_key: str | None
    token: str

    def as_job(self, **changes: Any) -> Job:
        fields = {k: v for k, v in self.__dict__.items() if k != "token"}
        fields.update(changes)
        return Job(**fields)


def _queue_filter(queues: Sequence[str] | None) -> tuple[str, list[Any]]:
    if not queues:
        return "", []
    return f" AND queue IN ({', '.join(['%s'] * len(queues))})", list(queues)


def due_select(columns: str, queues: Sequence[str] | None, now: int, limit: int) -> tuple[str, list[Any]]:
    """The claim's candidate query: due jobs in queue order (what the indexes must serve)."""
    qsql, qparams = _queue_filter(queues)
    return (
        f"SELECT {columns} FROM rws_jobs WHERE status = 'pending' AND next_run_at <= %s{qsql} "
        f"ORDER BY {ORDER} LIMIT %s",
        [now, *qparams, limit],
    )


class Store:
    """Queue statements on one connection (the thread's Django one, or a private one)."""

    def __init__(self, conn: BaseDatabaseWrapper):
        self.conn = conn
        self.vendor = conn.vendor

    # -- claim ---------------------------------------------------------------------------------

    def claim(
        self, token: str, now: int, lease_until: int, queues: Sequence[str] | None, limit: int
    ) -> list[Claimed]:
        """Atomically take up to ``limit`` due jobs, in queue order, leased to ``token``."""
        sets = "status = 'running', locked_by = %s, locked_until = %s, started_at = %s"
        set_params = [token, lease_until, now]
        if self.vendor == "mysql":
            rows = self._claim_mysql(sets, set_params, queues, now, limit)
        else:
            select, params = due_select("id", queues, now, limit)
            lock = " FOR UPDATE SKIP LOCKED" if self.vendor == "postgresql" else ""
            with self.conn.cursor() as c:
                c.execute(
                    f"UPDATE rws_jobs SET {sets} WHERE id IN ({select}{lock}) RETURNING {CLAIM_COLUMNS}",
                    [*set_params, *params],
                )
                rows = c.fetchall()
            # RETURNING does not keep the subquery's order.
            rows.sort(key=lambda r: (-r[4], r[7], r[8], r[0]))
        return [Claimed(*row, token=token) for row in rows]

    def _claim_mysql(self, sets: str, set_params: list[Any], queues: Sequence[str] | None,
                     now: int, limit: int) -> list[tuple]:
        """InnoDB locks every row a sorted FOR UPDATE reads before its LIMIT applies, so one claimer
        would lock all due rows and the others would skip them all. Instead: read the first due
        ids without locking, then lock them one by one (SKIP LOCKED) until ``limit`` are ours;
        a row another worker holds is passed over at once."""
        select, params = due_select("id", queues, now, limit + 8)
        lock_one = f"SELECT {CLAIM_COLUMNS} FROM rws_jobs WHERE id = %s AND status = 'pending' FOR UPDATE SKIP LOCKED"
        for _ in range(5):
            with atomic(self.conn), self.conn.cursor() as c:
                c.execute(select, params)
                candidates = [r[0] for r in c.fetchall()]
                if not candidates:
                    return []
                rows: list[tuple] = []
                for job_id in candidates:
                    c.execute(lock_one, [job_id])
                    row = c.fetchone()
                    if row is not None:
                        rows.append(row)
                        if len(rows) == limit:
                            break
                if rows:
                    c.execute(
                        f"UPDATE rws_jobs SET {sets} WHERE id IN ({', '.join(['%s'] * len(rows))})",
                        [*set_params, *(r[0] for r in rows)],
                    )
                    return rows
            # Every candidate went to other workers meanwhile: look again at once.
        return []

    # -- outcomes (each fenced on the claim's token) ---------------------------------------------

    def _fenced(self, sql: str, params: list[Any], job: Claimed, expired_before: int | None = None) -> bool:
        """Apply ``sql`` only while ``job.token`` still holds the row (and, for recovery, only
        while its lease is still expired: a holder that renewed in time keeps it)."""
        where = " WHERE id = %s AND status = 'running' AND locked_by = %s"
        params = [*params, job.id, job.token]
        if expired_before is not None:
            where += " AND locked_until < %s"
            params.append(expired_before)
        with self.conn.cursor() as c:
            c.execute(sql + where, params)
            return c.rowcount == 1

    def complete(self, job: Claimed) -> bool:
        return self._fenced("DELETE FROM rws_jobs", [], job)

    def reschedule(
        self, job: Claimed, attempts: int, error: str, tb: str | None, next_run_at: int,
        expired_before: int | None = None,
    ) -> bool:
        return self._fenced(
            "UPDATE rws_jobs SET status = 'pending', attempts = %s, last_error = %s, traceback = %s, "
            "next_run_at = %s, locked_by = NULL, locked_until = NULL",
            [attempts, error, tb, next_run_at],
            job,
            expired_before,
        )

    def bury(
        self, job: Claimed, attempts: int, error: str, tb: str | None, now: int,
        expired_before: int | None = None,
    ) -> bool:
        """Move to the dead-letter list; a failed job no longer holds its unique key."""
        return self._fenced(
            "UPDATE rws_jobs SET status = 'failed', attempts = %s, last_error = %s, traceback = %s, "
            "failed_at = %s, unique_hash = NULL, locked_by = NULL, locked_until = NULL",
            [attempts, error, tb, now],
            job,
            expired_before,
        )

    def release(self, job: Claimed) -> bool:
        """Hand a job back unrun (graceful shutdown): pending again, no attempt charged."""
        return self._fenced(
            "UPDATE rws_jobs SET status = 'pending', locked_by = NULL, locked_until = NULL", [], job
        )

    # -- leases ----------------------------------------------------------------------------------

    def renew(self, tokens: Sequence[str], until: int) -> int:
        if not tokens:
            return 0
        with self.conn.cursor() as c:
            c.execute(
                f"UPDATE rws_jobs SET locked_until = %s WHERE status = 'running' "
                f"AND locked_by IN ({', '.join(['%s'] * len(tokens))})",
                [until, *tokens],
            )
            return c.rowcount

    def held(self, tokens: Sequence[str]) -> set[str]:
        """The job ids still held under these claim tokens."""
        if not tokens:
            return set()
        with self.conn.cursor() as c:
            c.execute(
                f"SELECT id FROM rws_jobs WHERE status = 'running' "
                f"AND locked_by IN ({', '.join(['%s'] * len(tokens))})",
                list(tokens),
            )
            return {r[0] for r in c.fetchall()}

    def lease_leaseless(self, now: int, until: int) -> int:
        """Give running rows that carry no lease (a seed writer's) one, so they are recovered
        only if nobody finishes them within a lease: a live Rust worker may still be running them."""
        with self.conn.cursor() as c:
            c.execute(
                "UPDATE rws_jobs SET locked_until = %s, locked_by = %s "
                "WHERE status = 'running' AND locked_until IS NULL",
                [until, "unknown (running row found without a lease)"],
            )
            return c.rowcount

    def expired(self, now: int, limit: int) -> list[Claimed]:
        """Running jobs whose lease ran out, with the token that held them."""
        with self.conn.cursor() as c:
            c.execute(
                f"SELECT {CLAIM_COLUMNS}, locked_by FROM rws_jobs "
                f"WHERE status = 'running' AND locked_until < %s ORDER BY locked_until LIMIT %s",
                [now, limit],
            )
            rows = c.fetchall()
        return [Claimed(*row[:-1], token=row[-1]) for row in rows]


__all__ = ["Claimed", "Store", "Status", "atomic"]
