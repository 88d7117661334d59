"""tests.settings plus cron schedules, for the worker processes and tick processes the tests start."""

from tests.settings import *  # noqa: F401,F403
from tests.settings import RWS_JOBS

SCHEDULES = {
    # Every second, on its own queue: the two-worker test counts the jobs it enqueues.
    "every-second": {"cron": "*/1 * * * * *", "job_type": "test.record", "payload": "tick", "queue": "sched"},
    # Hourly: the six-process test ticks it at a due time it chooses.
    "race": {"cron": "0 0 * * * *", "job_type": "test.record", "payload": "race"},
}
RWS_JOBS = {**RWS_JOBS, "SCHEDULES": SCHEDULES}
