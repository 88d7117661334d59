import pytest
from django.db import connection, connections

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite connection set-up")]


def pragma(conn, name):
    with conn.cursor() as c:
        c.execute(f"PRAGMA {name}")
        return c.fetchone()[0]


def test_sqlite_connections_get_wal_busy_timeout_and_immediate_transactions():
    conn = connections.create_connection("default")
    try:
        conn.ensure_connection()
        assert pragma(conn, "journal_mode") == "wal"
        assert pragma(conn, "busy_timeout") == 30000
        assert pragma(conn, "synchronous") == 1  # NORMAL
        assert conn.transaction_mode == "IMMEDIATE"
    finally:
        conn.close()


def test_the_users_choices_are_kept():
    from django.db.backends.sqlite3.base import DatabaseWrapper

    settings_dict = {**connection.settings_dict, "OPTIONS": {"timeout": 2, "transaction_mode": "DEFERRED"}}
    conn = DatabaseWrapper(settings_dict, alias="default")
    try:
        conn.ensure_connection()
        assert pragma(conn, "busy_timeout") == 2000
        assert conn.transaction_mode == "DEFERRED"
    finally:
        conn.close()
