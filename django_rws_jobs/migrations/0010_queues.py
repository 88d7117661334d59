# rws_queues: what an operator set on a queue (a pause). Ours alone: the Rust crate knows no such
# table, and its workers must be given queues that are never paused (docs/design.md).

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
