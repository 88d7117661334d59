import pytest

import django_rws_jobs as rws
from django_rws_jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_tick_runs_and_deletes(runs):
    job_id = rws.enqueue("test.record", "hello")
    assert Job.objects.get(id=job_id).status == "pending"
    assert rws.tick() is True
    assert runs() == [("record", "hello")]
    assert not Job.objects.filter(id=job_id).exists()
    assert rws.tick() is False
