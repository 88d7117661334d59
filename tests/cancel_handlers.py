"""Handlers of tests/test_cancel.py that worker processes run too: tests/settings_cancel.py imports
this module, and the tests import it for tick(). Like tests/testapp/jobs.py, they leave their
traces in the database (or in files) so that other processes see them."""

import asyncio
import os
import sys
import time
from pathlib import Path

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


@job("cancel.linger_after_return")
def linger_after_return(payload: str) -> None:
    """Returns at once, having done its work, then holds its thread at the first Python call the
    worker makes after the return (its clean-up) until the file ``go`` appears in the directory
    ``payload``; it creates ``returned`` there once it is held. A profile function does the
    holding: it runs after the handler's frame is gone, so what interrupts it there interrupts
    the worker's clean-up, not the handler."""
    _trace("done", payload)
    sys.setprofile(hold_after_return(Path(payload)))


@job("cancel.async_linger_after_return")
async def async_linger_after_return(payload: str) -> None:
    """linger_after_return as an async def handler: it leaves ``done`` in the directory
    ``payload``, then holds its event loop's thread at the first Python call after its return."""
    directory = Path(payload)
    (directory / "done").touch()
    sys.setprofile(hold_after_return(directory))


@job("cancel.async_sleep")
async def async_sleep(payload: str) -> None:
    """Awaits a long asyncio.sleep; leaves ``started`` in the directory ``payload`` first, and
    ``stopped`` when asyncio.CancelledError reaches it."""
    directory = Path(payload)
    (directory / "started").touch()
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        (directory / "stopped").touch()
        raise


def hold_after_return(directory: Path):
    """The profile function of a handler (or task) that lingers after its return: set it as the
    handler's last call, so that the first return it sees is the handler's own."""
    returned = False

    def hold(frame, event, arg):
        nonlocal returned
        if event == "return" and not returned:
            returned = True  # this handler's own return: the first one after setprofile
        elif event == "call" and returned:
            sys.setprofile(None)
            (directory / "returned").touch()
            while not (directory / "go").exists():
                time.sleep(0.01)

    return hold
