import pytest
from django.core.management import call_command
from django.db import connection


@pytest.mark.django_db
def test_makemigrations_is_clean():
    call_command("makemigrations", "django_rws_jobs", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_tables_have_the_seed_defaults_in_the_database():
    # A writer that knows only the seed's required columns (as the Rust crate's older versions
    # insert) gets the seed's defaults from the database itself.
    with connection.cursor() as c:
        c.execute("INSERT INTO rws_jobs (id, job_type, next_run_at, created_at) VALUES ('seed-1', 't', 1, 1)")
        c.execute(
            "SELECT payload, status, attempts, max_retries, queue, priority, unique_key, last_error "
            "FROM rws_jobs WHERE id = 'seed-1'"
        )
        assert c.fetchone() == ("", "pending", 0, 3, "default", 0, None, None)


@pytest.mark.django_db
def test_indexes_exist():
    with connection.cursor() as c:
        constraints = connection.introspection.get_constraints(c, "rws_jobs")
    claim_columns = ["status", "priority", "next_run_at", "created_at", "id"]
    assert constraints["rws_jobs_claim_idx"]["columns"] == claim_columns
    assert constraints["rws_jobs_due_idx"]["columns"] == ["status", "next_run_at", "priority"]
    assert constraints["rws_jobs_queue_idx"]["columns"] == ["status", "queue", *claim_columns[1:]]
    assert constraints["rws_jobs_unique_active"]["unique"] is True
    assert "rws_jobs_lease_idx" not in constraints  # dropped by 0006: recovery reads the running range


@pytest.mark.django_db
def test_postgres_has_the_notify_trigger_and_no_like_index_on_the_id():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    with connection.cursor() as c:
        c.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'rws_jobs'")
        assert not [d for (d,) in c.fetchall() if "varchar_pattern_ops" in d]
        c.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'rws_jobs'::regclass AND NOT tgisinternal")
        assert [r[0] for r in c.fetchall()] == ["rws_jobs_notify"]


@pytest.mark.django_db
def test_postgres_vacuums_the_queue_table_by_its_own_settings():
    # 0021: a few thousand dead rows, not a fifth of the table, start its vacuum (the reason is
    # in the migration and docs/howto/databases.md); unapplied, the table has the server's.
    import importlib

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    migration = importlib.import_module("django_rws_jobs.migrations.0021_queue_table_autovacuum")

    def options():
        with connection.cursor() as c:
            c.execute("SELECT reloptions FROM pg_class WHERE oid = 'rws_jobs'::regclass")
            return sorted(c.fetchone()[0] or [])

    assert options() == sorted(f"{name}={value}" for name, value in migration.SETTINGS.items())
    with connection.schema_editor() as editor:
        migration.backwards(None, editor)
    assert options() == []
    with connection.schema_editor() as editor:
        migration.forwards(None, editor)
    assert len(options()) == len(migration.SETTINGS)
