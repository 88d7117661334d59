# A job's own time limit in seconds (enqueue(timeout=)); nullable, so the Rust crate's inserts,
# which do not name it, leave it NULL and the job takes its type's limit.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_rws_jobs", "0008_task_results")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="timeout",
            field=models.FloatField(blank=True, help_text="seconds; empty: the job type's limit", null=True),
        ),
    ]
