import math

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings

from django_rws_jobs.checks import check_settings


def ids(**rws_jobs):
    with override_settings(RWS_JOBS=rws_jobs):
        return [m.id for m in check_settings()]


def test_defaults_pass():
    assert ids() == []
    assert [m.id for m in checks.run_checks(tags=["rws_jobs"])] == []


@pytest.mark.parametrize(
    "key, value, check_id",
    [
        ("DATABASE", "missing", "rws_jobs.E002"),
        ("MAX_RETRIES", -1, "rws_jobs.E003"),
        ("MAX_RETRIES", "3", "rws_jobs.E003"),
        ("BACKOFF_INITIAL", -0.1, "rws_jobs.E004"),
        ("BACKOFF_MULTIPLIER", 0.5, "rws_jobs.E005"),
        ("BACKOFF_MAX", 0, "rws_jobs.E006"),
        ("POLL_INTERVAL", 0, "rws_jobs.E007"),
        ("LEASE_SECONDS", 1, "rws_jobs.E008"),
        ("LEASE_SECONDS", 2.5, "rws_jobs.E008"),
        ("SHUTDOWN_TIMEOUT", -1, "rws_jobs.E009"),
        ("SCHEDULES", [], "rws_jobs.E010"),
        ("RECOVERY_INTERVAL", 0, "rws_jobs.E011"),
        ("WORKER_SYNCHRONOUS_COMMIT", "off", "rws_jobs.E012"),
        # Every number finite and within its bounds (the worker and --poll-interval share the rules).
        ("MAX_RETRIES", True, "rws_jobs.E003"),
        ("BACKOFF_INITIAL", math.nan, "rws_jobs.E004"),
        ("BACKOFF_INITIAL", 365 * 86400 + 1, "rws_jobs.E004"),
        ("BACKOFF_MULTIPLIER", math.inf, "rws_jobs.E005"),
        ("BACKOFF_MULTIPLIER", 1001, "rws_jobs.E005"),
        ("BACKOFF_MAX", math.inf, "rws_jobs.E006"),
        ("BACKOFF_MAX", math.nan, "rws_jobs.E006"),
        ("POLL_INTERVAL", math.nan, "rws_jobs.E007"),
        ("POLL_INTERVAL", math.inf, "rws_jobs.E007"),
        ("LEASE_SECONDS", 10**20, "rws_jobs.E008"),
        ("LEASE_SECONDS", 7 * 86400 + 1, "rws_jobs.E008"),
        ("SHUTDOWN_TIMEOUT", math.inf, "rws_jobs.E009"),
        ("SHUTDOWN_TIMEOUT", math.nan, "rws_jobs.E009"),
        ("SHUTDOWN_TIMEOUT", 86401, "rws_jobs.E009"),
        ("RECOVERY_INTERVAL", math.inf, "rws_jobs.E011"),
        ("RECOVERY_INTERVAL", math.nan, "rws_jobs.E011"),
        ("STATEMENT_DEADLINE", 0.5, "rws_jobs.E017"),
        ("STATEMENT_DEADLINE", math.inf, "rws_jobs.E017"),
        ("STATEMENT_DEADLINE", "20", "rws_jobs.E017"),
    ],
)
def test_each_bad_setting_has_its_own_id(key, value, check_id):
    with override_settings(RWS_JOBS={key: value}):
        messages = check_settings()
    assert [m.id for m in messages] == [check_id]
    assert repr(value) in messages[0].msg and key in messages[0].msg


def test_the_bounds_are_inclusive_and_named_in_the_message():
    year = 365 * 86400
    assert (
        ids(
            MAX_RETRIES=2**31 - 1,
            BACKOFF_INITIAL=year,
            BACKOFF_MULTIPLIER=1000,
            BACKOFF_MAX=year,
            POLL_INTERVAL=3600,
            LEASE_SECONDS=7 * 86400,
            SHUTDOWN_TIMEOUT=86400,
            RECOVERY_INTERVAL=86400,
        )
        == []
    )
    assert (
        ids(BACKOFF_INITIAL=0, BACKOFF_MULTIPLIER=1, POLL_INTERVAL=0.001, LEASE_SECONDS=2, SHUTDOWN_TIMEOUT=0)
        == []
    )
    with override_settings(RWS_JOBS={"LEASE_SECONDS": 7 * 86400 + 1, "POLL_INTERVAL": math.nan}):
        assert [m.msg for m in check_settings()] == [
            "RWS_JOBS['POLL_INTERVAL'] is nan; it must be a number of seconds in (0, 3600]",
            "RWS_JOBS['LEASE_SECONDS'] is 604801; it must be an integer number of seconds in [2, 604800]",
        ]


def test_unknown_keys_of_any_type_warn():
    with override_settings(RWS_JOBS={1: 2, "X": 3, None: 4}):
        assert [m.msg for m in check_settings()] == [
            "RWS_JOBS has an unknown key 'X'",
            "RWS_JOBS has an unknown key 1",
            "RWS_JOBS has an unknown key None",
        ]


def test_unknown_key_warns_and_non_dict_errors():
    assert ids(MAX_RETRY=3) == ["rws_jobs.W001"]
    with override_settings(RWS_JOBS=[("MAX_RETRIES", 3)]):
        assert [m.id for m in check_settings()] == ["rws_jobs.E001"]


def test_settings_are_read_at_each_access():
    from django_rws_jobs.conf import jobs_settings

    assert jobs_settings.MAX_RETRIES == 3
    with override_settings(RWS_JOBS={"MAX_RETRIES": 7}):
        assert jobs_settings.MAX_RETRIES == 7
    assert jobs_settings.MAX_RETRIES == 3


def test_database_check_passes_here():
    from django_rws_jobs.checks import check_database

    assert check_database() == []


@pytest.mark.django_db  # Django 6.1's model checks connect to every database
@pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite library's version")
def test_a_plain_check_reports_a_too_old_sqlite(monkeypatch):
    import sqlite3

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    with pytest.raises(SystemCheckError, match="rws_jobs.E013"):
        call_command("check")


@pytest.mark.parametrize("value", ["default", ["missing"], [None], {"default": 1}])
def test_sqlite_setup_aliases_must_be_a_list_of_database_aliases(value):
    with override_settings(RWS_JOBS={"SQLITE_SETUP_ALIASES": value}):
        messages = check_settings()
    assert [m.id for m in messages] == ["rws_jobs.E014"]
    assert "SQLITE_SETUP_ALIASES" in messages[0].msg and "a list of aliases in DATABASES" in messages[0].msg
    assert ids(SQLITE_SETUP_ALIASES=["default"]) == [] and ids(SQLITE_SETUP_ALIASES=()) == []
