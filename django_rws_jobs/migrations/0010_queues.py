# rws_queues: what an operator set on a queue (a pause) and its rate limit's window. Ours alone:
# the Rust crate knows no such table, and its workers must be given queues that are never paused
# and have no limits (docs/design.md).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0009_job_timeout"),
    ]

    operations = [
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("paused", models.BooleanField(db_default=False, default=False)),
                (
                    "paused_at",
                    models.BigIntegerField(blank=True, help_text="unix seconds: last paused", null=True),
                ),
                ("window_start", models.BigIntegerField(blank=True, help_text="unix seconds", null=True)),
                ("window_claims", models.IntegerField(db_default=0, default=0)),
            ],
            options={
                "verbose_name": "queue",
                "verbose_name_plural": "queues",
                "db_table": "rws_queues",
                "permissions": [("pause_queue", "Can pause and resume queues")],
                "default_permissions": (),
            },
        ),
    ]
