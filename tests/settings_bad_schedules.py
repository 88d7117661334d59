"""tests.settings plus one broken schedule of each kind: rws_worker must refuse to start."""

from tests.settings import *  # noqa: F401,F403
from tests.settings import RWS_JOBS

SCHEDULES = {
    "bad-cron": {"cron": "0 0 25 * * *", "job_type": "test.record"},
    "never": {"cron": "0 0 0 30 2 *", "job_type": "test.record"},
    "unknown-type": {"cron": "0 0 3 * * *", "job_type": "reports.nightly"},
    "bad-option": {"cron": "0 0 3 * * *", "job_type": "test.record", "priority": "high"},
}
RWS_JOBS = {**RWS_JOBS, "SCHEDULES": SCHEDULES}
