# Per-key concurrency (enqueue(concurrency_key=)): the key, its limit and the slot a pending or
# running job holds, the new status 'waiting', the index of the promotion, and the unique
# constraint that lets no two jobs of one key hold one slot. Ours alone: the Rust crate never
# reads these columns, and claims only pending rows, so it never starts a waiting job
# (docs/design.md "Concurrency keys").
#
# Where the database has partial indexes (PostgreSQL, SQLite) the index holds waiting rows only
# and the constraint rows with a slot only, so that jobs without a key cost no index writes; on
# MariaDB/MySQL both hold every row (NULLs never conflict). Django's state keeps the plain forms.

from django.db import migrations, models
from django.db.models import Q

WAITING_INDEX = models.Index(
    fields=["concurrency_key", "-priority", "next_run_at", "created_at", "id"], name="rws_jobs_waiting_idx"
)
SLOT_UNIQUE = models.UniqueConstraint(
    fields=["concurrency_key", "concurrency_slot"], name="rws_jobs_key_slot_unique"
)


def _forms(connection):
    if not connection.features.supports_partial_indexes:
        return WAITING_INDEX, SLOT_UNIQUE
    index = models.Index(fields=WAITING_INDEX.fields, name=WAITING_INDEX.name, condition=Q(status="waiting"))
    unique = models.UniqueConstraint(
        fields=SLOT_UNIQUE.fields, name=SLOT_UNIQUE.name, condition=Q(concurrency_slot__isnull=False)
    )
    return index, unique


def _key_collation(apps, schema_editor, exact: bool) -> None:
    """MariaDB/MySQL: keys match exactly, as the columns of migration 0007 do ("Account:1" and
    "account:1 " are two keys: tests/test_exact_match.py)."""
    conn = schema_editor.connection
    if conn.vendor != "mysql":
        return
    from django_rws_jobs.migrations import _exact  # (MariaDB's only)

    model = apps.get_model("django_rws_jobs", "Job")
    _exact.alter(schema_editor, model, "concurrency_key", exact)


def forwards(apps, schema_editor):
    model = apps.get_model("django_rws_jobs", "Job")
    _key_collation(apps, schema_editor, True)
    index, unique = _forms(schema_editor.connection)
    schema_editor.add_index(model, index)
    schema_editor.add_constraint(model, unique)


def backwards(apps, schema_editor):
    model = apps.get_model("django_rws_jobs", "Job")
    index, unique = _forms(schema_editor.connection)
    schema_editor.remove_constraint(model, unique)
    schema_editor.remove_index(model, index)
    _key_collation(apps, schema_editor, False)


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0010_queues"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=191, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_limit",
            field=models.IntegerField(blank=True, help_text="empty: 1", null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_slot",
            field=models.IntegerField(blank=True, editable=False, null=True),
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
                ],
                db_default="pending",
                default="pending",
                max_length=16,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="job", index=WAITING_INDEX),
                migrations.AddConstraint(model_name="job", constraint=SLOT_UNIQUE),
            ],
            # Not atomic: MariaDB cannot roll back DDL (migration 0007).
            database_operations=[migrations.RunPython(forwards, backwards, atomic=False, elidable=False)],
        ),
    ]
