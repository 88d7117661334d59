# Enqueueing once per burst (api/enqueue_once.py): a debounced job's latest due time
# (rws_jobs.due_by, nullable: the Rust crate neither reads nor writes it) and the throttles'
# windows (rws_unique_windows, ours: the crate never reads it).

from django.db import migrations, models

from django_rws_jobs.migrations import _exact

#: MariaDB/MySQL: the hash and the id compare exactly, as rws_jobs' do (0007, 0015).
COLUMNS = {"uniquewindow": ["unique_hash", "job_id"]}


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0024_checkpoints"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="due_by",
            field=models.BigIntegerField(
                blank=True, editable=False, help_text="unix seconds: due no later (max_delay)", null=True
            ),
        ),
        migrations.CreateModel(
            name="UniqueWindow",
            fields=[
                ("unique_hash", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("job_id", models.CharField(max_length=64)),
                ("until", models.BigIntegerField(help_text="unix seconds")),
            ],
            options={
                "verbose_name": "unique window",
                "verbose_name_plural": "unique windows",
                "db_table": "rws_unique_windows",
                "default_permissions": (),
                "indexes": [models.Index(fields=["until"], name="rws_unique_windows_until_idx")],
            },
        ),
        _exact.collate(COLUMNS),
    ]
