"""tests.settings plus a second SQLite database, "other", that is not the queue's, for the
process tests/test_sqlite.py starts (RWS_TEST_OTHER_SQLITE names its file)."""

import os

from tests.settings import *  # noqa: F401,F403
from tests.settings import DATABASES

OTHER = {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["RWS_TEST_OTHER_SQLITE"]}
DATABASES = {**DATABASES, "other": OTHER}
