# Cancelling (cancellation.py): the status 'cancelled', a running job's cancel request, and when
# and by whom a job was cancelled. Ours alone: the Rust crate claims only pending rows, so it
# never runs a cancelled one.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0012_workers"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "permissions": [("cancel_job", "Can cancel jobs")],
                "verbose_name": "job",
                "verbose_name_plural": "jobs",
            },
        ),
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.BigIntegerField(blank=True, help_text="unix seconds", null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="cancelled_at",
            field=models.BigIntegerField(blank=True, help_text="unix seconds", null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="cancelled_by",
            field=models.CharField(blank=True, max_length=191, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "pending"),
                    ("running", "running"),
                    ("failed", "failed"),
                    ("waiting", "waiting"),
                    ("cancelled", "cancelled"),
                ],
                db_default="pending",
                default="pending",
                max_length=16,
            ),
        ),
    ]
