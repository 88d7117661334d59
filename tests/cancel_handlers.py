"""Handlers of tests/test_cancel.py that worker processes run too: tests/settings_cancel.py imports
this module, and the tests import it for tick(). Like tests/testapp/jobs.py, they leave their
traces in the database so that other processes see them."""

import os

from django_rws_jobs import JobCancelled as RwsJobCancelled
from django_rws_jobs import job


class JobCancelled(Exception):
    """An application's own exception that happens to share our exception's name."""


def _trace(kind: str, payload: str) -> None:
    from tests.testapp.models import Run

    Run.objects.create(kind=kind, payload=payload, pid=os.getpid())


@job("cancel.apps_own_error")
def apps_own_error(payload: str) -> None:
    """Fails with an application's exception named JobCancelled: its last_error reads
    ``JobCancelled: <payload>`` although nobody asked to cancel it."""
    _trace("apps_own", payload)
    raise JobCancelled(payload)


@job("cancel.raises_ours")
def raises_ours(payload: str) -> None:
    """Raises django_rws_jobs.JobCancelled itself, with no cancel requested."""
    _trace("raises_ours", payload)
    raise RwsJobCancelled(payload)
