# Batch outputs (running/context.py JobContext.record, Batch.outputs): rws_batch_outputs. Ours: the
# Rust crate never reads the table.

from django.db import migrations, models

from django_rws_jobs.migrations import _exact

#: MariaDB/MySQL: the ids compare exactly, as rws_jobs.id does (0007, 0015).
COLUMNS = {"batchoutput": ["job_id", "batch_id"]}


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0018_dependencies"),
    ]

    operations = [
        migrations.CreateModel(
            name="BatchOutput",
            fields=[
                ("job_id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("batch_id", models.CharField(max_length=64)),
                ("value", models.TextField()),
                ("recorded_at", models.BigIntegerField()),
            ],
            options={
                "verbose_name": "batch output",
                "verbose_name_plural": "batch outputs",
                "db_table": "rws_batch_outputs",
                "default_permissions": (),
                "indexes": [models.Index(fields=["batch_id", "job_id"], name="rws_batch_outputs_idx")],
            },
        ),
        _exact.collate(COLUMNS),
    ]
