"""The queue in Django's admin: jobs (read-only), the dead-letter list, schedules, a queue overview and
django.tasks results, and the workers.

Importing this package (Django's admin autodiscovery does) registers the pages on ``admin.site``.
"""

from .batches import BatchAdmin
from .dead import FailedJobAdmin
from .jobs import JobAdmin
from .overview_entry import QueueOverviewAdmin
from .schedules import JobScheduleAdmin
from .tasks import TaskResultAdmin
from .workers import WorkerAdmin

__all__ = [
    "BatchAdmin",
    "FailedJobAdmin",
    "JobAdmin",
    "JobScheduleAdmin",
    "QueueOverviewAdmin",
    "TaskResultAdmin",
    "WorkerAdmin",
]
