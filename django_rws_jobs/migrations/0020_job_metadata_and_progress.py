# What a running job knows and tells (running/context.py, running/reports.py): rws_jobs.metadata
# (JSON, from enqueue(metadata=) and save_metadata()), rws_jobs.progress (JSON) and progress_at,
# and rws_task_results.metadata (a task's metadata, kept after it succeeded). Ours, all nullable:
# the Rust crate neither reads nor writes them.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0019_batch_outputs"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="metadata",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.TextField(
                blank=True, editable=False, null=True, help_text="JSON: current, total, message"
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="progress_at",
            field=models.FloatField(blank=True, editable=False, null=True, help_text="unix seconds"),
        ),
        migrations.AddField(
            model_name="taskresultrecord",
            name="metadata",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
