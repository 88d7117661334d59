"""tick(): claim one due job and run it in the calling thread, its lease renewed meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

from ..attempts.run import run_claimed
from ..checks import require_valid_settings
from ..conf import jobs_settings
from ..database import clock
from ..database.connections import queue_alias
from ..database.validation import queue_list
from ..flow.concurrency_keys import KeySweep, promote
from ..flow.limited_claims import claim_limited_queues
from ..flow.pauses import NONE_UNPAUSED, QueueFilter
from ..queue import ids
from ..queue.store import Store
from ..running.context import inline
from ..running.context import serving as serving_alias
from .reconnect import Connection, Retry


def tick(*, queues: list[str] | None = None, using: str | None = None) -> bool:
    """Claim one due job and run it in the calling thread. False when none is due."""

    queues = queue_list(queues)
    alias = queue_alias(using)
    require_valid_settings()
    store = Store(connections[alias])
    lease = int(jobs_settings.LEASE_SECONDS)

    serving = QueueFilter(queues)
    unlimited = serving.current(store)  # paused and limited queues left out
    now = int(clock.now(alias))
    KeySweep().sweep_all(store, now)  # jobs with a concurrency key whose key has room: pending
    token = ids.claim_token()
    claimed = [] if unlimited is NONE_UNPAUSED else store.claim(token, now, now + lease, unlimited, 1)
    if not claimed and serving.limited:
        claimed = claim_limited_queues(store, serving.limited, serving.limits, token, now, now + lease, 1)[0]
    if not claimed:
        return False
    job = claimed[0]
    with _renewing(alias, job.token, lease):
        serves = serving_alias.set(alias)  # current_job()'s database
        # Claimed inside the caller's transaction: only its connection sees the job's row.
        inlined = inline.set(connections[alias].in_atomic_block)
        try:
            run_claimed(store, job)
        finally:
            inline.reset(inlined)
            serving_alias.reset(serves)
    if job.concurrency_key is not None:  # its slot is free: the key's next job
        promote(store, [job.concurrency_key], int(clock.now(alias)))
    return True


@contextmanager
def _renewing(alias: str, token: str, lease: int) -> Iterator[None]:
    """Renew a claim's lease from a side thread while the calling thread runs the job; each renewal
    is tried once, and a failed one again at the next round: the lease is long."""

    done = threading.Event()

    def renew() -> None:
        db = Retry(Connection(alias), done)
        try:
            while not done.wait(max(lease / 3, 0.2)):
                try:
                    db.once(
                        lambda c: c.store().renew([token], int(clock.now(alias)) + lease), "renewing a lease"
                    )
                except Exception:  # noqa: BLE001, S110  (Retry logs database errors; retried next round)
                    pass
        finally:
            db.holder.close()

    thread = threading.Thread(target=renew, name="rws-tick-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
