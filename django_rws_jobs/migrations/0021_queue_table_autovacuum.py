# PostgreSQL only: autovacuum settings of rws_jobs's own (docs/howto/databases.md, "Long
# transactions"). Every job leaves two dead row versions, and the claims read past the pending
# ones' index entries until vacuum removes them. The defaults wait for 20% of the table's rows
# plus 50 to die: beside 300,000 future jobs, 60,000 dead versions at the front of every claim's
# range. Here vacuum starts at 1% plus 1,000, without the cost limit's pauses (a queue table is
# small and hot: its vacuum should finish in seconds), and statistics follow the table's churn.
# The Rust crate is unaffected: these are the table's storage parameters.

from django.db import migrations

SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
    "autovacuum_analyze_scale_factor": "0.02",
}


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        pairs = ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
        schema_editor.execute(f"ALTER TABLE rws_jobs SET ({pairs})")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE rws_jobs RESET ({', '.join(SETTINGS)})")


class Migration(migrations.Migration):
    dependencies = [("django_rws_jobs", "0020_job_metadata_and_progress")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
