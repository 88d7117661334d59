# How many times a job's handler raised Snooze (attempts/outcomes.py): ours, nullable, so a
# snoozed row stays a valid pending row for the Rust crate, which neither reads nor writes it;
# and the snoozes the metrics count per minute and in their totals (operations/metrics.py).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0022_worker_claim_p99"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.IntegerField(blank=True, editable=False, help_text="times it snoozed", null=True),
        ),
        migrations.AddField(
            model_name="metricminute",
            name="snoozed",
            field=models.BigIntegerField(default=0, help_text="attempts that ended in Snooze"),
        ),
        migrations.AddField(
            model_name="metrictotal",
            name="snoozed",
            field=models.BigIntegerField(default=0),
        ),
    ]
