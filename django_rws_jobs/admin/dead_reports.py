"""What the dead-letter list's actions report: the admin log of the jobs they retried or deleted,
and messages naming the jobs they skipped."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from ..database.connections import queue_alias
from ..models import FailedJob, Job, Status

#: Ids named in one message at most; the rest are counted.
MAX_IDS_SHOWN = 10
#: Ids per IN (...) list: SQLite builds may allow as few as 999 parameters.
BATCH = 500
#: Jobs an action logs one by one (each job's history shows it, as Django's own actions log);
#: a bigger selection gets one entry naming the count.
LOG_EACH = 100


def batches(ids: list[str]) -> Iterator[list[str]]:
    """``ids`` in lists of BATCH, each short enough for one IN (...)."""
    for i in range(0, len(ids), BATCH):
        yield ids[i : i + BATCH]


def ids_text(ids: list[str]) -> str:
    """Up to MAX_IDS_SHOWN of ``ids``, and how many more there are, for a message."""
    more = len(ids) - MAX_IDS_SHOWN
    return ", ".join(ids[:MAX_IDS_SHOWN]) + (_(" and %(n)d more") % {"n": more} if more > 0 else "")


def _user_id(request: HttpRequest) -> Any:
    user_id = request.user.pk
    assert user_id is not None, "admin views run for logged-in staff only"
    return user_id


class DeadLetterReports(admin.ModelAdmin):
    """The admin log entries and the messages of the dead-letter list's actions."""

    @contextmanager
    def done_before_failure(
        self, request: HttpRequest, flag: int, ids: list[str], job_types: dict[str, str] | None = None
    ) -> Iterator[None]:
        """Around an action's batches, each committed on its own: when one fails, log the jobs
        that the batches before it changed (``ids``, filled in meanwhile) and say so, then let
        the failure go on."""
        try:
            yield
        except Exception:
            if ids:
                self.log_jobs(request, flag, ids, job_types or None)
                done = _("retried") if flag == CHANGE else _("deleted")
                self.message_user(
                    request,
                    _("An error stopped the action after %(count)d dead jobs were %(done)s.")
                    % {"count": len(ids), "done": done},
                    messages.ERROR,
                )
            raise

    def log_jobs(
        self,
        request: HttpRequest,
        flag: int,
        ids: list[str],
        job_types: dict[str, str] | None = None,
    ) -> None:
        """The admin log of an action: one entry per job for up to LOG_EACH jobs, as Django's own
        actions write them; past that one entry naming the count, on no object: an entry per job
        was half of a retry-all of 100,000 jobs, and a log of 100,000 lines tells an operator no
        more than "Retried 100000 dead jobs" (tests/test_admin_input.py::test_a_big_action_logs_one_entry).
        job_types: each id's job type (for the entries' text), read from the table when None."""
        retry = flag == CHANGE
        if len(ids) > LOG_EACH:
            LogEntry.objects.create(
                user_id=_user_id(request),
                action_flag=flag,
                object_id=None,
                content_type=ContentType.objects.get_for_model(FailedJob, for_concrete_model=False),
                object_repr=f"{len(ids)} dead jobs",
                change_message=(
                    f"{'Retried' if retry else 'Deleted'} {len(ids)} dead jobs from the dead-letter list"
                ),
            )
        elif ids:
            if job_types is None:
                job_types = dict(
                    Job.objects.using(queue_alias()).filter(pk__in=ids).values_list("pk", "job_type")
                )
            model, status = (Job, Status.PENDING) if retry else (FailedJob, Status.FAILED)
            jobs = [model(id=pk, job_type=job_types.get(pk, ""), status=status) for pk in ids]
            LogEntry.objects.log_actions(
                _user_id(request),
                jobs,
                flag,
                change_message="Retried from the dead-letter list" if retry else "",
            )

    def report_gone(self, request: HttpRequest, ids: list[str]) -> None:
        """Warn about selected jobs that left the list since the page was shown, grouped by why."""
        if not ids:
            return
        found: dict[str, str] = {}
        for batch in batches(ids):
            found.update(Job.objects.using(queue_alias()).filter(pk__in=batch).values_list("pk", "status"))
        reasons = {
            Status.PENDING: _("it was retried meanwhile and is pending"),
            Status.RUNNING: _("it was retried meanwhile and is running"),
            Status.WAITING: _("it was retried meanwhile and waits for its concurrency key"),
            None: _("it no longer exists"),
        }
        groups: dict[Any, list[str]] = {}
        for job_id in ids:
            groups.setdefault(found.get(job_id), []).append(job_id)
        for status, group in groups.items():
            self.message_user(
                request,
                ngettext(
                    "Skipped %(count)d job that left the dead-letter list (%(reason)s): %(ids)s.",
                    "Skipped %(count)d jobs that left the dead-letter list (%(reason)s): %(ids)s.",
                    len(group),
                )
                % {"count": len(group), "reason": reasons.get(status, status), "ids": ids_text(group)},
                messages.WARNING,
            )
