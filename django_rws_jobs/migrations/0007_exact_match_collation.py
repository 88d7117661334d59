# MariaDB/MySQL only: the columns the queue compares get a binary, no-pad collation, so that they
# match exactly whatever the database's default collation is. Under the server default
# utf8mb4_general_ci, tick(queues=["Mail"]) took a job of queue "mail", "🔥" matched "💧" and
# "reports  " matched "reports" (tests/test_tick.py test_queue_names_match_exactly). utf8mb4_bin
# is not enough: it pads, and "a " = "a" under it. A later AlterField of these columns must keep
# the collation (Django's MODIFY would drop it).

from django.db import migrations

COLUMNS = {"job": ["id", "job_type", "queue", "unique_key", "locked_by"], "jobschedule": ["name"]}


def exact_collation(connection) -> str:
    """The utf8mb4 collation that compares bytes and does not pad: MariaDB's and MySQL 8's names."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


def _alter(apps, schema_editor, collate: bool) -> None:
    conn = schema_editor.connection
    if conn.vendor != "mysql":
        return
    for model_name, names in COLUMNS.items():
        model = apps.get_model("django_rws_jobs", model_name)
        for name in names:
            plain = model._meta.get_field(name)
            exact = plain.clone()
            exact.db_collation = exact_collation(conn)
            exact.set_attributes_from_name(name)
            exact.model = model
            old, new = (plain, exact) if collate else (exact, plain)
            schema_editor.alter_field(model, old, new)


def forwards(apps, schema_editor):
    _alter(apps, schema_editor, True)


def backwards(apps, schema_editor):
    _alter(apps, schema_editor, False)


class Migration(migrations.Migration):
    dependencies = [("django_rws_jobs", "0006_drop_lease_index")]
    # Not atomic: MariaDB cannot roll back DDL, and Django refuses DDL inside a transaction there.
    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
