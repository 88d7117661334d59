"""A claimed job as the worker holds it: the claim's columns, in order, and its token."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

from ...models import CLAIM_ORDER, Job


@dataclasses.dataclass
class Claimed:
    """A job this worker holds, with the token that fences its outcome. The fields before
    ``token`` are the claim's columns, in order (CLAIM_COLUMNS); those after it are learnt later."""

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
    timeout: float | None
    concurrency_key: str | None
    # Set when a cancel was asked while the job ran before and it came back to the queue without
    # it being carried out (the Rust crate's retry or its start-up reset): outcomes.asked_to_cancel.
    cancel_requested_at: int | None
    token: str
    # Not claim columns: the deletion of a finished job returns them (delete_finished), so a
    # claim costs nothing more for them. The batch this job is a member of, or whose callback it
    # is (api/batches.py); whether a job waits for this one (workflows/dependencies.py).
    batch_id: str | None = None
    has_dependents: bool | None = None
    # Not a field (no annotation): the JobContext of this attempt, made by the first
    # current_job() (running/context.py), so every call in the attempt sees the same one.
    context = cast(Any, None)

    @classmethod
    def from_row(cls, row: Sequence[Any], token: str) -> Claimed:
        """A claim's row (CLAIM_COLUMNS, in order) held by ``token``."""
        return cls(*row, token)  # type: ignore[call-arg]  # (a row is the fields before token)

    @classmethod
    def stand_in(
        cls, job_id: str, batch_id: str | None = None, has_dependents: bool | None = None
    ) -> Claimed:
        """A claim that carries only what outcomes' bookkeeping reads (batch_outcomes.settle):
        for a job that ended outside a worker's claim (a cancel, the sweep)."""
        return cls(job_id, "", "", "", 0, 0, 0, 0, 0, None, None, None, None, "", batch_id, has_dependents)

    def as_job(self, **changes: Any) -> Job:
        fields = {k: v for k, v in self.__dict__.items() if k not in ("token", "context")}
        fields.update(changes)
        return Job(**fields)


_FIELDS = [f.name for f in dataclasses.fields(Claimed)]
#: The columns a claim returns: Claimed's fields before the token, so ``Claimed(*row, token)`` reads them.
CLAIM_COLUMNS = ", ".join(_FIELDS[: _FIELDS.index("token")])


def claim_order_key(job: Claimed) -> tuple[Any, ...]:
    return tuple(-getattr(job, n[1:]) if n[0] == "-" else getattr(job, n) for n in CLAIM_ORDER)
