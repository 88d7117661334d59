import pytest
from django.core import checks
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
    ],
)
def test_each_bad_setting_has_its_own_id(key, value, check_id):
    with override_settings(RWS_JOBS={key: value}):
        messages = check_settings()
    assert [m.id for m in messages] == [check_id]
    assert repr(value) in messages[0].msg and key in messages[0].msg


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


@pytest.mark.parametrize("value", ["default", ["missing"], [None], {"default": 1}])
def test_sqlite_setup_aliases_must_be_a_list_of_database_aliases(value):
    with override_settings(RWS_JOBS={"SQLITE_SETUP_ALIASES": value}):
        messages = check_settings()
    assert [m.id for m in messages] == ["rws_jobs.E014"]
    assert "SQLITE_SETUP_ALIASES" in messages[0].msg and "a list of aliases in DATABASES" in messages[0].msg
    assert ids(SQLITE_SETUP_ALIASES=["default"]) == [] and ids(SQLITE_SETUP_ALIASES=()) == []
