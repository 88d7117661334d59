# settings.py: the queue's part of a project's settings
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_rws_jobs",
    "shop",
]

RWS_JOBS = {  # every key is optional
    "MAX_RETRIES": 3,  # retries after the first attempt
    "LEASE_SECONDS": 60,  # a crashed worker's jobs run again after this
    "QUEUES": {"mailers": {"concurrency": 10, "rate_limit": "100/m"}},
    "SCHEDULES": {
        "nightly-receipts": {
            "cron": "0 0 3 * * *",
            "job_type": "shop.send_receipt",
            "payload": "ops@example.com",
        }
    },
}

TASKS = {"default": {"BACKEND": "django_rws_jobs.tasks.RwsJobsBackend", "QUEUES": ["default"]}}
