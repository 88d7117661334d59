# Dependencies (workflows/dependencies.py): the status blocked, rws_job_dependencies (what each job
# enqueued with after= waits for) and rws_jobs.has_dependents. Ours: the Rust crate claims only
# pending rows, so it never runs a blocked one.

from django.db import migrations, models

from django_rws_jobs.migrations import _exact

#: MariaDB/MySQL: the ids compare exactly, as rws_jobs.id does (0007, 0015).
COLUMNS = {"dependency": ["job_id", "depends_on"]}


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0017_batches"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="has_dependents",
            field=models.BooleanField(blank=True, editable=False, null=True),
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
                    ("blocked", "blocked"),
                ],
                db_default="pending",
                default="pending",
                max_length=16,
            ),
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id", "depends_on", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("job_id", models.CharField(max_length=64)),
                ("depends_on", models.CharField(max_length=64)),
                ("on_batch", models.BooleanField(db_default=False, default=False)),
                ("policy", models.CharField(db_default="cancel", default="cancel", max_length=8)),
                ("outcome", models.CharField(blank=True, max_length=16, null=True)),
            ],
            options={
                "verbose_name": "dependency",
                "verbose_name_plural": "dependencies",
                "db_table": "rws_job_dependencies",
                "default_permissions": (),
                "indexes": [models.Index(fields=["depends_on"], name="rws_job_dependencies_on_idx")],
            },
        ),
        _exact.collate(COLUMNS),
    ]
