"""The tutorial runs verbatim: the wheel, in a fresh virtualenv beside the newest Django its
metadata admits, and docs/tutorial/first-job.md's commands and files as the page shows them
(tests/tutorial.py), through a --burst worker and the admin."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.tutorial import COMMANDS, Tutorial, file_name, steps, wheel

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        connection.vendor != "sqlite", reason="SQLite, whatever the run's database: once, in its cells"
    ),
]


def test_the_page_shows_the_commands_this_test_runs():
    assert [value for kind, value in steps() if kind == "sh"] == COMMANDS
    files = [file_name(value) for kind, value in steps() if kind == "file"]
    assert files == ["settings.py", "settings.py", "shop/jobs.py", "shop/views.py", "mysite/urls.py"]


def test_the_first_job_tutorial_runs_as_written(tmp_path):
    (tmp_path / "wheel").mkdir()
    (tmp_path / "project").mkdir()
    tutorial = Tutorial(tmp_path / "project", wheel(tmp_path / "wheel"))
    tutorial.follow()
    out = tutorial.outputs

    assert "Successfully installed" in out["pip install django-rws-jobs"]
    posted = out["curl -d email=ada@example.com http://127.0.0.1:8000/order/"]
    assert posted.startswith("receipt job "), posted
    job_id = posted.split()[2]
    # The admin, before a worker ran: the job waits in its queue.
    assert job_id in out["admin"] and "shop.send_receipt" in out["admin"], out["admin"]
    # The --burst worker ran it: the console backend printed the email, the worker counted it done.
    burst = out["python manage.py rws_worker --burst"]
    assert "Subject: Your receipt" in burst and "To: ada@example.com" in burst, burst
    assert "stopped: 1 done, 0 retried, 0 dead" in burst, burst
    assert job_id not in out["admin after the worker"]  # its row was deleted
    assert "mailers" in out["admin after the worker"]  # (the same page, the queue's filter)
    assert '"POST /order/ HTTP/1.1" 202' in out["runserver"], out["runserver"]
    assert job_id not in tutorial.outputs["python manage.py rws_worker --workers 4"]  # nothing left
