# MariaDB/MySQL only: the columns the queue compares get a binary, no-pad collation, so that they
# match exactly whatever the database's default collation is. Under the server default
# utf8mb4_general_ci, tick(queues=["Mail"]) took a job of queue "mail", "🔥" matched "💧" and
# "reports  " matched "reports" (tests/test_tick.py test_queue_names_match_exactly). utf8mb4_bin
# is not enough: it pads, and "a " = "a" under it. A later AlterField of these columns must keep
# the collation (Django's MODIFY would drop it).

from django.db import migrations

from django_rws_jobs.migrations import _exact
from django_rws_jobs.migrations._exact import exact_collation  # noqa: F401  (migration 0008 uses it)

COLUMNS = {"job": ["id", "job_type", "queue", "unique_key", "locked_by"], "jobschedule": ["name"]}


def _alter(apps, schema_editor, collate: bool) -> None:
    conn = schema_editor.connection
    if conn.vendor != "mysql":
        return
    for model_name, names in COLUMNS.items():
        model = apps.get_model("django_rws_jobs", model_name)
        for name in names:
            _exact.alter(schema_editor, model, name, collate)


def forwards(apps, schema_editor):
    _alter(apps, schema_editor, True)


def backwards(apps, schema_editor):
    _alter(apps, schema_editor, False)


class Migration(migrations.Migration):
    dependencies = [("django_rws_jobs", "0006_drop_lease_index")]
    # Not atomic: MariaDB cannot roll back DDL, and Django refuses DDL inside a transaction there.
    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
