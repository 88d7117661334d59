"""The dispatcher: claims as many due jobs as there are idle executors, in one statement."""

from __future__ import annotations

import time

from django.db import Error as DatabaseError

from ..conf import jobs_settings
from ..database import clock
from ..database.backends import BaseFeatures
from ..database.connections import is_transient
from ..flow.concurrency_keys import KeySweep
from ..flow.limited_claims import claim_limited_queues
from ..flow.pauses import NONE_UNPAUSED, QueueFilter
from ..queue.ids import claim_token
from ..queue.store import Claimed, Store
from ..workflows.dependency_outcomes import release_in_claim
from .completer import settle_batches
from .reconnect import Connection, Retry
from .shared import Shared, outcomes

#: Jobs shorter than this (seconds, on average) are claimed for several idle executors at once.
GATHER_MAX = 0.001
#: How often an idle worker on SQLite checks whether another connection wrote (seconds).
SQLITE_WATCH_INTERVAL = 0.002


class Dispatcher:
    """Claim due jobs for idle executors; on SQLite, delete the succeeded ones in the same
    transaction (features.deletes_with_claim). With ``burst`` it stops once nothing is due and
    nothing runs; with ``max_jobs`` once it claimed that many and they are done.

    Each claim round is a turn (shared.progress); waiting for an idle executor and the idle
    waits are waits by design."""

    ROLE = "rws-dispatcher"

    def __init__(
        self,
        shared: Shared,
        features: BaseFeatures,
        *,
        deletes_with_claim: bool | None = None,
        queues: list[str] | None,
        burst: bool,
        max_jobs: int | None,
        poll_interval: float,
    ):
        self.shared = shared
        self.features = features
        #: features.deletes_with_claim as the worker read it at its start (None: read it here).
        self.deletes_with_claim = (
            features.deletes_with_claim if deletes_with_claim is None else deletes_with_claim
        )
        self.queues = QueueFilter(queues)
        self.keys = KeySweep()
        #: The last claim round began with a sweep of every concurrency key (--burst).
        self.swept = False
        #: The last idle wait ended with a wake-up hint.
        self.woken = False
        #: Due jobs of a limited queue were left for its limits at the last claim.
        self.held_back = False
        #: At the last --burst sweep, a job this worker serves waited for a running job's key.
        self.key_blocked = False
        self.turn = 0
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = poll_interval
        self.claimed_total = 0
        self.lease = int(jobs_settings.LEASE_SECONDS)
        self.holder = Connection(shared.alias)
        self.db = Retry(self.holder, shared.stop)

    def loop(self) -> None:
        shared = self.shared
        with shared.cond:
            shared.delete_with_claim = self.deletes_with_claim
        try:
            idle: bool | None = False
            while idle is not None and not shared.stop.is_set():
                idle = self.run_once(idle)
        finally:
            with shared.cond:
                shared.delete_with_claim = False
                left, shared.finished = shared.finished, []
            shared.to_completer(left)
            self.holder.close()

    def _claim_size(self) -> tuple[int, list[Claimed]] | None:
        """How many jobs to claim (waiting for an idle executor) and the succeeded jobs to delete
        with the claim; None when the dispatcher is to stop."""
        shared = self.shared
        with shared.cond:
            if shared.free == 0:
                with shared.progress.waiting(self.ROLE):  # the executors run jobs
                    while shared.free == 0 and not shared.stop.is_set():
                        shared.cond.wait(0.5)
            if shared.recent_run is not None and shared.free < shared.threads:
                self._gather(shared.recent_run)
            n = shared.free
            if self.max_jobs is not None:
                n = min(n, self.max_jobs - self.claimed_total)
                if n <= 0:  # claimed all it may: stop once they are done
                    with shared.progress.waiting(self.ROLE):
                        while shared.free < shared.threads and not shared.stop.is_set():
                            shared.cond.wait(0.5)
                    shared.stop_all()
                    return None
            finished, shared.finished = shared.finished, []
        if shared.stop.is_set():
            shared.to_completer(finished)
            return None
        return n, finished

    def _gather(self, recent_run: float) -> None:
        """With jobs shorter than GATHER_MAX, wait up to one job's time for the busy executors to
        become idle too, so that one claim serves several instead of one claim a job (the
        process pool, whose executors return one by one; the caller holds ``shared.cond``). Longer
        jobs are claimed for at once: a claim costs little beside them
        (tests/test_timeouts.py::test_short_jobs_are_claimed_for_several_executors_at_once)."""
        if recent_run >= GATHER_MAX:
            return
        shared = self.shared
        deadline = time.monotonic() + recent_run
        while shared.free < shared.threads and not shared.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            shared.cond.wait(left)

    def run_once(self, idle: bool) -> bool | None:
        """Claim once, then wait if nothing was due. Returns whether the next claim is to look
        with read-only statements first (nothing was due and no hint came), or None to stop."""
        shared = self.shared
        shared.progress.turn(self.ROLE)
        # Cleared before the succeeded jobs are taken: one that arrives after the take finds the
        # hint clear, or set since, and the idle wait below returns for it (Executor._outcome).
        shared.wake.clear()
        size = self._claim_size()
        if size is None:
            return None
        n, finished = size
        # A burst may end only if nothing was running when this look began: a job that
        # finishes meanwhile may have enqueued another.
        busy = shared.free < shared.threads or bool(shared.held)
        now = int(clock.now(shared.alias))
        lease_end = now + self.lease
        token = claim_token()
        try:
            started = time.perf_counter()
            done, claimed = self.db.until_stopped(
                lambda c: self._finish_and_claim(c.store(), finished, token, now, lease_end, n, idle),
                "claiming",
            )
            shared.stats.claimed(time.perf_counter() - started)
        except DatabaseError as exc:
            shared.to_completer(finished)
            if not is_transient(exc):
                shared.fail(exc, "claiming")
            return None  # a permanent error, or stopping
        except BaseException:  # a bug: the succeeded jobs still get deleted (by the completer)
            shared.to_completer(finished)
            raise
        if finished:
            ended = outcomes(finished, done)
            shared.stats.add(ended)
            shared.counters.ended(finished, ended)
            shared.let_go(finished)
            if any([job.batch_id is not None or job.has_dependents for job in finished]):  # (all succeeded)
                pairs = list(zip(finished, ended, strict=True))
                settle_batches(self.db, time.monotonic() + self.lease, shared, pairs)
        if claimed:
            return self._hand_out(claimed)
        if self.burst:
            if not self.swept:
                return True  # look again at once, with a sweep of every concurrency key
            return self._burst_wait(busy or self.held_back or self.key_blocked)
        # Woken by a hint (NOTIFY, a job enqueued in this process, another process's write on
        # SQLite), claim straight away; after a plain poll interval, look with read-only
        # statements first.
        woken = self._idle_wait()
        # A resume's hint (or, while a queue is paused, any idle poll: MariaDB/MySQL send no
        # hint): read the pauses before claiming, so a resume takes effect within the poll
        # interval (tests/test_pauses.py::test_a_paused_queue_starts_nothing_while_others_run).
        self.queues.recheck = woken or bool(self.queues.paused)
        self.woken = woken
        return not woken

    def _take_keys_hint(self) -> bool:
        """Whether a due_now came since the last look (shared.due_now); reset before the sweep
        it asks for, so that one coming during the sweep asks again."""
        hinted = self.shared.keys_hint
        self.shared.keys_hint = False
        return hinted

    def _finish_and_claim(
        self, store: Store, finished: list[Claimed], token: str, now: int, lease_end: int, n: int, idle: bool
    ) -> tuple[set[str], list[Claimed]]:
        """store.finish_and_claim from the queues that are neither paused nor limited (with none
        such, only the deletions), then claims of the limited queues for what is left of ``n``.
        Before them, at most KeySweep.REFRESH apart, the sweep of the concurrency keys."""
        serving = self.queues
        queues = serving.current(store)
        # A --burst worker decides to stop on a sweep of every key, after a round that claimed
        # nothing. A hint that woke an idle worker may be a keyed job's enqueue: swept at once.
        self.swept = self.burst and idle
        hinted = self._take_keys_hint()
        if self.swept:
            # Every key, then whether a job this worker serves waits for a running job's key.
            self.keys.sweep_all(store, now)
            own = serving.own
            served = None if own is None else [q for q in own if q not in serving.paused]
            self.key_blocked = self.keys.waiting and self.keys.blocked_in(store, now, served, serving.paused)
        elif self.keys.stale() or self.woken or hinted:
            self.keys.sweep(store, now)
        self.woken = False
        done: set[str]
        claimed: list[Claimed]
        if queues is NONE_UNPAUSED:
            done, claimed = (store.complete_many(finished) if finished else set()), []
        else:
            done, claimed = store.finish_and_claim(
                finished, token, now, lease_end, queues, n, probe_first=idle, release=release_in_claim
            )
        self.held_back = False
        if serving.limited and len(claimed) < n:
            claimed += self._claim_limited(store, token, now, lease_end, n - len(claimed))
        return done, claimed

    def _claim_limited(self, store: Store, token: str, now: int, lease_end: int, n: int) -> list[Claimed]:
        """The limited queues' claims, starting from a different queue each time so that none
        of them goes last for ever."""
        limited = self.queues.limited
        self.turn = (self.turn + 1) % len(limited)
        rotated = limited[self.turn :] + limited[: self.turn]
        claimed, self.held_back = claim_limited_queues(
            store, rotated, self.queues.limits, token, now, lease_end, n
        )
        return claimed

    def _hand_out(self, claimed: list[Claimed]) -> bool | None:
        shared = self.shared
        if shared.stop.is_set():
            shared.hand_back(claimed, "claimed as the worker stopped")
            return None
        self.claimed_total += len(claimed)
        with shared.cond:
            shared.free -= len(claimed)
        shared.hold(claimed)
        for job in claimed:
            shared.work.put(job)
        return False

    def _burst_wait(self, busy: bool) -> bool | None:
        shared = self.shared
        with shared.cond:
            if not busy and shared.free == shared.threads:
                shared.stop_all()  # nothing due and nothing running
                return None
            with shared.progress.waiting(self.ROLE):
                shared.cond.wait(self.poll_interval)  # a running job may enqueue more
        return True

    def _idle_wait(self) -> bool:
        """Wait until woken or POLL_INTERVAL passes; True when woken by a hint."""
        with self.shared.progress.waiting(self.ROLE):
            if self.features.wakeup == "data_version":
                return self._watch_data_version()
            return self.shared.wake.wait(self.poll_interval)

    def _watch_data_version(self) -> bool:
        """Wait as _idle_wait does, and also until another connection commits to the SQLite file:
        ``PRAGMA data_version`` tells without reading a table, so an idle worker notices new jobs
        within milliseconds
        (tests/test_worker.py::test_an_idle_sqlite_worker_sees_another_process_enqueue_at_once)."""
        wake = self.shared.wake
        deadline = time.monotonic() + self.poll_interval
        try:
            with self.holder.store().conn.cursor() as c:
                c.execute("PRAGMA data_version")
                version = c.fetchone()[0]
                while not wake.wait(min(SQLITE_WATCH_INTERVAL, max(deadline - time.monotonic(), 0))):
                    if time.monotonic() >= deadline:
                        return False
                    c.execute("PRAGMA data_version")
                    if c.fetchone()[0] != version:
                        return True
                return True
        except DatabaseError:
            self.holder.reset()
            return wake.wait(max(deadline - time.monotonic(), 0))
