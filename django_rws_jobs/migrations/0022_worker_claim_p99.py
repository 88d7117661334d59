# rws_workers.claim_p99: each worker's claims' 99th percentile between its last two heartbeats
# (operations/worker_rows.py), for the metrics endpoint and rws_health --max-claim-p99. Ours:
# the Rust crate does not know rws_workers.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0021_queue_table_autovacuum"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="claim_p99",
            field=models.FloatField(
                blank=True,
                help_text="seconds: the 99th percentile of its claims' durations between its last two heartbeats",
                null=True,
            ),
        ),
    ]
