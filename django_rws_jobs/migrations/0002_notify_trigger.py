from django.db import migrations

# PostgreSQL only: wake idle workers when jobs are inserted (a hint; workers also poll), and no
# LIKE index on the job id.
CREATE = """
CREATE OR REPLACE FUNCTION rws_jobs_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('rws_jobs', '');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS rws_jobs_notify ON rws_jobs;
CREATE TRIGGER rws_jobs_notify AFTER INSERT ON rws_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION rws_jobs_notify();
"""
DROP = """
DROP TRIGGER IF EXISTS rws_jobs_notify ON rws_jobs;
DROP FUNCTION IF EXISTS rws_jobs_notify();
"""


# Django gives a varchar primary key a second, varchar_pattern_ops index for LIKE queries. Nothing
# here searches job ids with LIKE, and every insert and delete would pay for it.
LIKE_INDEXES = """
SELECT indexname FROM pg_indexes
WHERE schemaname = current_schema() AND tablename = 'rws_jobs' AND indexdef LIKE '%%varchar_pattern_ops%%'
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(LIKE_INDEXES)
            names = [row[0] for row in cursor.fetchall()]
        for name in names:
            schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_rws_jobs", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
