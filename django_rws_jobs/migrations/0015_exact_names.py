# MariaDB/MySQL only: the columns outside rws_jobs that name a queue, a job type, a worker or its
# host get the binary, no-pad collation of 0007, so that they match exactly as rws_jobs.queue
# does. Under the server default utf8mb4_general_ci, pause_queue("mail") found the row "Mail",
# resume_queue("MAIL") resumed "mail", the limited queues "Mail" and "mail" shared one rate
# window, and the metrics of "app.send " were added to "app.send"
# (tests/test_exact_match.py; test_every_compared_column_is_exact checks every column of the
# app's tables).

from django.db import migrations

from django_rws_jobs.migrations import _exact

COLUMNS = {
    "queue": ["name"],
    "metricminute": ["queue", "job_type"],
    "metrictotal": ["queue", "job_type"],
    "worker": ["id", "host"],
}


def forwards(apps, schema_editor):
    _exact.alter_columns(apps, schema_editor, COLUMNS, True)


def backwards(apps, schema_editor):
    _exact.alter_columns(apps, schema_editor, COLUMNS, False)


class Migration(migrations.Migration):
    dependencies = [("django_rws_jobs", "0014_metrics")]
    # Not atomic: MariaDB cannot roll back DDL, and Django refuses DDL inside a transaction there.
    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
