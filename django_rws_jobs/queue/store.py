"""The queue's statements on one connection: claim, finish (fenced), renew, hand back, recover.

Raw SQL on purpose: these statements run for every job, and each must be one round trip where
the database allows it. The statements and what differs between databases are in backends/; a
Store holds what one connection's claims keep between calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..database.backends import backend_for
from ..database.backends.claimed import Claimed
from ..database.backends.statements import DELETED_RETURNING, Sql
from ..database.connections import atomic
from ..flow.concurrency_keys import promote
from ..models import Status

#: Prefix of the lease given to a running row found without one (a rust-web-server claim).
RUST_CLAIM_MARKER = "seed:"
#: Who cancelled a job whose handler raised Cancel (``cancelled_by``).
HANDLER = "handler"
#: What a job that goes back to the queue is set to: pending, or waiting if it has a concurrency
#: key, its slot freed in the same statement (concurrency_keys.py).
BACK_IN_QUEUE = (
    "status = CASE WHEN concurrency_key IS NULL THEN 'pending' ELSE 'waiting' END, concurrency_slot = NULL"
)


class Store:
    """Queue statements on one connection (the thread's Django one, or a private one)."""

    def __init__(self, conn: BaseDatabaseWrapper):
        self.conn = conn
        self.backend = backend_for(conn)
        self.features = self.backend.features
        self.private = getattr(conn, "rws_private", False)
        # The worker's own PostgreSQL connections prepare the statements that run for every job
        # (claim, completion, renewal): see PostgreSQLBackend.prepares_statements and ScopedCursor.
        self.prepare = self.backend.prepares_statements()
        # Where the last claim stopped, (priority, next_run_at, created_at, id), and until when
        # (time.monotonic()) the next claim may start there (see BaseBackend.resume_point).
        self.resume: tuple[Any, ...] | None = None
        self.resume_until = 0.0
        # The queue filter of the claims that set the point (a tuple, or None for every queue).
        self.resume_queues: tuple[str, ...] | None = None
        # PostgreSQL: until when (time.monotonic()) claims resume at all (see
        # PostgreSQLBackend.claim).
        self.resuming_until = 0.0
        # PostgreSQL: how long (seconds) the last claim from the band's start took.
        self.start_claim_took = 0.0
        # The last band walk passed bands that hold only future jobs: the next claim walks first
        # too, instead of trying the top band (a claim that finds nothing) every time.
        self.walk_first = False
        self.writes = self.backend.write_lock()  # held around each write (see SQLiteBackend.write_lock)
        self._kept: Any = None  # the private connection's cursor, once opened (see cursor)

    def cursor(self) -> AbstractContextManager[Any]:
        """A cursor for the next statements. On the worker's own connections one is kept for the
        Store's life, the driver's (see backends.cursors.DriverCursor); on Django's connections,
        a new one each time, closed after use.
        """
        if self._kept is None:
            if not self.private:
                return self.conn.cursor()
            self._kept = self.backend.driver_cursor()
        return self._kept

    def atomic(self) -> AbstractContextManager[None]:
        """A short write transaction (see BaseBackend.atomic), on the kept cursor where there is one."""
        return self.backend.atomic(cursor=self.cursor() if self.private else None)

    def execute(self, c: Any, sql: str, params: list[Any]) -> None:
        """Run one of the hot statements, prepared where ``self.prepare`` says so."""
        if self.prepare:
            c.execute(sql, params, True)
        else:
            c.execute(sql, params)

    # -- claim ---------------------------------------------------------------------------------

    def finish_and_claim(
        self,
        finished: Sequence[Claimed],
        token: str,
        now: int,
        lease_until: int,
        queues: Sequence[str] | None,
        limit: int,
        probe_first: bool = False,
        release: Callable[[Store, Sequence[Claimed], set[str], int], None] | None = None,
    ) -> tuple[set[str], list[Claimed]]:
        """``complete_many(finished)``, then ``claim(...)``; returns (ids deleted, jobs claimed).

        Where ``features.deletes_with_claim`` both are one transaction: on SQLite, which runs one
        writer at a time anyway, a transaction around them (a commit and a turn at the write lock
        fewer per batch); on PostgreSQL and MariaDB, the claim's own first call
        (_finish_in_claim_query: one round trip fewer). See docs/design.md, "Completing jobs".
        """
        if self.features.deletes_in_claim_query and finished and self.private and self.defers():
            claim = lambda: self.claim(token, now, lease_until, queues, limit, probe_first)  # noqa: E731
            return self._finish_in_claim_query(finished, now, claim)
        if self.features.deletes_with_claim and finished and self.features.serializes_writes:
            with self.writes, self.atomic():
                done = self.complete_many(finished)
                self.promote_freed(finished, done, now, in_transaction=True)
                if release is not None:
                    release(self, finished, done, now)
                return done, self.claim(token, now, lease_until, queues, limit, probe_first)
        done = self.complete_many(finished) if finished else set()
        self.promote_freed(finished, done, now)
        return done, self.claim(token, now, lease_until, queues, limit, probe_first)

    def defers(self) -> bool:
        """Whether the kept cursor sends deferred statements with the next one (PostgreSQL's
        ScopedCursor under psycopg 3, MariaDB's DeferringCursor where the driver sends several
        statements per call)."""
        return hasattr(self.cursor(), "defer")

    def _finish_in_claim_query(
        self, finished: Sequence[Claimed], now: int, claim: Callable[[], list[Claimed]]
    ) -> tuple[set[str], list[Claimed]]:
        """finish_and_claim where the deletions go in the first call of ``claim()`` (the kept
        cursor's ``defer``): one round trip, deleted and claimed in one transaction or neither.
        The keys the deletions freed are promoted after it; what waits for the deleted jobs is
        released by batch_outcomes.settle, as for the completer's deletions."""
        with self.cursor() as c:
            try:
                for held_by, ids in _by_token(finished).items():
                    delete = self.backend.complete_delete(ids, held_by).add(DELETED_RETURNING)
                    c.defer(delete.text, delete.params, self.prepare)
                claimed = claim()
                deleted = c.take_deferred_rows()
            finally:
                c.drop_deferred()  # none left for the next statement, whatever failed
        done = self._learn(finished, [row for rows in deleted for row in rows])
        self.promote_freed(finished, done, now)
        return done, claimed

    def promote_freed(
        self, finished: Sequence[Claimed], done: set[str], now: int, in_transaction: bool = False
    ) -> None:
        """Promote the next jobs of the keys whose slots the deletion of ``done`` freed."""
        keys = [job.concurrency_key for job in finished if job.concurrency_key is not None and job.id in done]
        if keys:
            promote(self, keys, now, in_transaction=in_transaction)

    def claim(
        self,
        token: str,
        now: int,
        lease_until: int,
        queues: Sequence[str] | None,
        limit: int,
        probe_first: bool = False,
    ) -> list[Claimed]:
        """Atomically take up to ``limit`` due jobs, in queue order (see BaseBackend.claim)."""
        return self.backend.claim(self, token, now, lease_until, queues, limit, probe_first)

    def complete_many(self, jobs: Sequence[Claimed]) -> set[str]:
        """Delete finished jobs in one statement per claim; return the ids this worker still held.
        Each job gets its ``batch_id`` and ``has_dependents`` as its deleted row had them."""
        rows: list[Any] = []
        with self.writes, self.cursor() as c:
            for token, ids in _by_token(jobs).items():
                rows += self.backend.delete_finished(self, c, token, ids)
        return self._learn(jobs, rows)

    @staticmethod
    def _learn(jobs: Sequence[Claimed], rows: list[Any]) -> set[str]:
        """The ids of the deleted ``rows`` (id, batch_id, has_dependents); each of ``jobs`` gets
        its ``batch_id`` and ``has_dependents`` as its deleted row had them."""
        # (list comprehensions: run inline, where a generator would resume once a row)
        learnt = dict([(row[0], (row[1], row[2])) for row in rows if row[1] is not None or row[2]])
        if learnt:
            for job in jobs:
                if job.id in learnt:
                    job.batch_id, job.has_dependents = learnt[job.id]
        return {row[0] for row in rows}

    # -- outcomes (each fenced on the claim's token) ---------------------------------------------

    def fenced(
        self,
        sql: str,
        params: list[Any],
        job: Claimed,
        expired_before: int | None = None,
        cancel_requested: bool | None = None,
    ) -> bool:
        """Apply ``sql`` only while ``job.token`` still holds the row (and, for recovery, only
        while its lease is still expired: a holder that renewed in time keeps it). With
        ``cancel_requested`` False, only if nobody asked to cancel the job; True, only if someone
        did (cancel_running): a job whose cancel was requested never goes back to the queue."""
        fenced = Sql(sql, params)
        fenced.add(" WHERE id = %s AND status = 'running' AND locked_by = %s", job.id, job.token)
        if expired_before is not None:
            fenced.add(" AND locked_until < %s", expired_before)
        if cancel_requested is not None:
            fenced.add(f" AND cancel_requested_at IS {'NOT ' if cancel_requested else ''}NULL")
        with self.writes, self.cursor() as c:
            c.execute(*fenced)
            return c.rowcount == 1

    def complete(self, job: Claimed) -> bool:
        """Delete one finished job (fenced, as complete_many), reading its ``has_dependents``."""
        return bool(self.complete_many([job]))

    def reschedule(
        self,
        job: Claimed,
        attempts: int,
        error: str,
        tb: str | None,
        next_run_at: int,
        expired_before: int | None = None,
    ) -> bool:
        return self.fenced(
            f"UPDATE rws_jobs SET {BACK_IN_QUEUE}, attempts = %s, last_error = %s, traceback = %s, "
            "next_run_at = %s, locked_by = NULL, locked_until = NULL",
            [attempts, error, tb, next_run_at],
            job,
            expired_before,
            cancel_requested=False,
        )

    def move_to_dead_letters(
        self,
        job: Claimed,
        attempts: int,
        error: str,
        tb: str | None,
        now: int,
        expired_before: int | None = None,
    ) -> bool:
        """Move to the dead-letter list; a failed job no longer holds its unique key or its slot."""
        return self.fenced(
            "UPDATE rws_jobs SET status = 'failed', attempts = %s, last_error = %s, traceback = %s, "
            "failed_at = %s, unique_hash = NULL, concurrency_slot = NULL, locked_by = NULL, "
            "locked_until = NULL",
            [attempts, error, tb, now],
            job,
            expired_before,
            cancel_requested=False,
        )

    def cancel_running(
        self,
        job: Claimed,
        error: str,
        tb: str | None,
        now: int,
        expired_before: int | None = None,
        requested: bool = True,
    ) -> bool:
        """End a held job whose cancel was ``requested`` (or, not, one whose handler raised
        Cancel: who cancelled it is then ``handler`` unless someone asked too): ``cancelled``,
        never retried; its unique key and concurrency slot freed (cancellation.py)."""
        return self.fenced(
            "UPDATE rws_jobs SET status = 'cancelled', cancelled_at = %s, last_error = %s, traceback = %s, "
            "cancelled_by = CASE WHEN cancel_requested_at IS NULL THEN %s ELSE cancelled_by END, "
            "unique_hash = NULL, concurrency_slot = NULL, locked_by = NULL, locked_until = NULL",
            [now, error, tb, HANDLER],
            job,
            expired_before,
            cancel_requested=True if requested else None,
        )

    def snooze(self, job: Claimed, next_run_at: int, expired_before: int | None = None) -> bool:
        """Put a held job back in the queue due at ``next_run_at``, its attempt not charged and
        its snoozes counted; its unique key kept, its slot freed as a retry's (BACK_IN_QUEUE)."""
        return self.fenced(
            f"UPDATE rws_jobs SET {BACK_IN_QUEUE}, snoozes = COALESCE(snoozes, 0) + 1, "
            "next_run_at = %s, locked_by = NULL, locked_until = NULL",
            [next_run_at],
            job,
            expired_before,
            cancel_requested=False,
        )

    def release(self, job: Claimed, resumed: bool = False) -> bool:
        """Hand a job back (graceful shutdown): pending (or waiting) again, no attempt charged;
        ``resumed``: its handler had started, and ``resumptions`` counts it."""
        counted = ", resumptions = COALESCE(resumptions, 0) + 1" if resumed else ""
        return self.fenced(
            f"UPDATE rws_jobs SET {BACK_IN_QUEUE}, locked_by = NULL, locked_until = NULL{counted}",
            [],
            job,
            cancel_requested=False,
        )

    # -- leases ----------------------------------------------------------------------------------

    def renew(self, tokens: Sequence[str], until: int) -> int:
        if not tokens:
            return 0
        with self.writes, self.cursor() as c:
            self.execute(c, *self.backend.renew_update(tokens, until))
            return c.rowcount

    def lease_leaseless(self, now: int, until: int) -> int:
        """Give running rows that carry no lease (a rust-web-server claim) one, so they are taken
        back only if nobody finishes them within a lease: a live Rust worker may be running them.

        The lease is marked ``seed:<attempts>:<next_run_at>`` (the stored marker keeps its name):
        the Rust crate never touches our columns, so when it retries the job and claims it again
        the row still carries this old, expired lease; the changed attempts or due time tell
        ``refresh_rust_claims`` it is a new claim, which gets a fresh lease instead of being taken
        from a worker that is alive.
        """
        marker = self.backend.rust_claim_marker_sql(RUST_CLAIM_MARKER)
        with self.writes, self.cursor() as c:
            c.execute(
                f"UPDATE rws_jobs{self.backend.running_index_hint()} SET locked_until = %s, "
                f"locked_by = {marker} WHERE status = 'running' AND locked_until IS NULL",
                [until],
            )
            return c.rowcount

    def refresh_rust_claims(self, now: int, until: int) -> int:
        """Fresh leases for rust-web-server claims whose marker no longer matches the row (see above)."""
        marker = self.backend.rust_claim_marker_sql(RUST_CLAIM_MARKER)
        with self.writes, self.cursor() as c:
            c.execute(
                f"UPDATE rws_jobs{self.backend.running_index_hint()} SET locked_until = %s, "
                f"locked_by = {marker} WHERE status = 'running' AND locked_until < %s AND locked_by LIKE %s "
                f"AND locked_by <> {marker}",
                [until, now, RUST_CLAIM_MARKER.replace("%", "") + "%"],
            )
            return c.rowcount

    def expired(self, now: int, limit: int) -> list[Claimed]:
        """Running jobs whose lease ran out, with the token that held them."""
        with self.cursor() as c:
            c.execute(*self.backend.expired_select(now, limit))
            return [Claimed(*row) for row in c.fetchall()]


__all__ = ["Claimed", "Status", "Store", "atomic"]


def _by_token(jobs: Sequence[Claimed]) -> dict[str, list[str]]:
    """The ids of ``jobs`` by the claim that holds them: one fenced deletion each."""
    by_token: dict[str, list[str]] = {}
    for job in jobs:
        by_token.setdefault(job.token, []).append(job.id)
    return by_token
