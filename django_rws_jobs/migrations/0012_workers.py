# The live workers (worker_rows.py): one row per rws_worker process. Ours alone: the Rust crate never
# reads it.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0011_concurrency_keys"),
    ]

    operations = [
        migrations.CreateModel(
            name="Worker",
            fields=[
                (
                    "id",
                    models.CharField(
                        help_text="host:pid:random", max_length=191, primary_key=True, serialize=False
                    ),
                ),
                ("host", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                (
                    "queues",
                    models.TextField(blank=True, default="", help_text="comma-separated; empty: every queue"),
                ),
                ("pool", models.CharField(help_text="threads or processes", max_length=16)),
                ("executors", models.IntegerField()),
                ("version", models.CharField(help_text="django-rws-jobs' version", max_length=64)),
                ("started_at", models.BigIntegerField(help_text="unix seconds")),
                ("heartbeat_at", models.BigIntegerField(help_text="unix seconds: the last renewal")),
                ("heartbeat_interval", models.FloatField(help_text="seconds between heartbeats")),
                (
                    "running",
                    models.TextField(
                        blank=True, default="[]", help_text="JSON: the ids of the jobs it holds"
                    ),
                ),
                ("done", models.BigIntegerField(default=0, help_text="jobs that succeeded since its start")),
                ("failed", models.BigIntegerField(default=0, help_text="failed attempts since its start")),
            ],
            options={
                "verbose_name": "worker",
                "verbose_name_plural": "workers",
                "db_table": "rws_workers",
                "default_permissions": ("view",),
            },
        ),
    ]
