"""Select tests by what the database can do, as Django's ``skipUnlessDBFeature`` does: by the
queue backend's features (django_rws_jobs.database.backends), not by the database's name."""

import pytest
from django.db import connection

from django_rws_jobs.database.backends import backend_for


def db_feature(name: str):
    return getattr(backend_for(connection).features, name)


def skip_unless_db_feature(name: str, value=True):
    """Skip unless the test database's backend has ``features.<name> == value``."""
    return pytest.mark.skipif(db_feature(name) != value, reason=f"needs features.{name} == {value!r}")
