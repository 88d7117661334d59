# Batches (api/batches.py): rws_batches, rws_batch_members (a row per member that has not
# succeeded), and on rws_jobs the batch a member or callback belongs to. All ours: the Rust crate
# ignores the columns and never reads the tables.

from django.db import migrations, models

from django_rws_jobs.migrations import _exact

#: MariaDB/MySQL: the ids compare exactly, as rws_jobs.id does (0007, 0015).
COLUMNS = {"job": ["batch_id"], "batchrecord": ["id"], "batchmember": ["job_id", "batch_id"]}


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0016_rate_log"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="batch_event",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="batch_id",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.CreateModel(
            name="BatchMember",
            fields=[
                ("job_id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("batch_id", models.CharField(max_length=64)),
                ("outcome", models.CharField(blank=True, max_length=16, null=True)),
            ],
            options={
                "verbose_name": "batch member",
                "verbose_name_plural": "batch members",
                "db_table": "rws_batch_members",
                "default_permissions": (),
                "indexes": [models.Index(fields=["batch_id", "outcome"], name="rws_batch_members_idx")],
            },
        ),
        migrations.CreateModel(
            name="BatchRecord",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("description", models.TextField(blank=True, db_default="", default="")),
                ("metadata", models.TextField(blank=True, help_text="JSON", null=True)),
                ("callbacks", models.TextField(db_default="{}", default="{}")),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("open", "open"),
                            ("sealed", "sealed"),
                            ("finished", "finished"),
                            ("cancelled", "cancelled"),
                        ],
                        db_default="open",
                        default="open",
                        max_length=16,
                    ),
                ),
                (
                    "outcome",
                    models.CharField(blank=True, help_text="succeeded or failed", max_length=16, null=True),
                ),
                ("fail_fast", models.BooleanField(db_default=False, default=False)),
                ("generation", models.IntegerField(db_default=0, default=0)),
                ("total", models.BigIntegerField(db_default=0, default=0, help_text="members added")),
                ("created_at", models.BigIntegerField(help_text="unix seconds")),
                ("sealed_at", models.BigIntegerField(blank=True, help_text="unix seconds", null=True)),
                ("finished_at", models.BigIntegerField(blank=True, help_text="unix seconds", null=True)),
            ],
            options={
                "verbose_name": "batch",
                "verbose_name_plural": "batches",
                "db_table": "rws_batches",
                "indexes": [models.Index(fields=["state", "finished_at"], name="rws_batches_state_idx")],
            },
        ),
        _exact.collate(COLUMNS),
    ]
