from django.db import migrations

# PostgreSQL only: wake idle workers when jobs are inserted (a hint; workers also poll).
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


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("django_rws_jobs", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
