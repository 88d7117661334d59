"""tests.settings plus the handlers of tests/cancel_handlers.py, for the worker processes that
tests/test_cancel.py starts (the package can be imported at settings time)."""

import tests.cancel_handlers  # noqa: F401  (registers the handlers)
from tests.settings import *  # noqa: F401,F403
