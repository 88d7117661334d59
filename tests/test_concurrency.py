"""Concurrency claims proven with real, separate processes."""

import time
from collections import Counter

import pytest

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from tests.conftest import run_python
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def start_together(code: str, n: int) -> list[str]:
    """Run ``code`` in n processes that all begin at the same instant; return their outputs."""
    start_at = time.time() + 3.0  # time for every interpreter to start and set Django up
    wrapped = f"import time\nwhile time.time() < {start_at}: time.sleep(0.001)\n{code}"
    procs = [run_python(wrapped) for _ in range(n)]
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        outputs.append(out)
    return outputs


def test_many_processes_enqueueing_one_unique_key_make_one_row():
    code = (
        "from django_rws_jobs import enqueue\n"
        "ids = [enqueue('test.record', 'u', unique='same-key') for _ in range(20)]\n"
        "print('ID', *sorted(set(ids)))\n"
    )
    outputs = start_together(code, 6)
    ids = {line.split()[1] for out in outputs for line in out.splitlines() if line.startswith("ID")}
    assert len(ids) == 1
    assert list(Job.objects.values_list("id", flat=True)) == list(ids)


def test_processes_ticking_run_each_job_exactly_once():
    for i in range(300):
        rws.enqueue("test.record", str(i))
    code = "from django_rws_jobs import tick\nn = 0\nwhile tick():\n    n += 1\nprint('RAN', n)\n"
    outputs = start_together(code, 4)
    ran = [int(line.split()[1]) for out in outputs for line in out.splitlines() if line.startswith("RAN")]
    counts = Counter(Run.objects.values_list("payload", flat=True))
    assert sorted(counts) == sorted(str(i) for i in range(300))
    assert set(counts.values()) == {1}
    assert sum(ran) == 300
    assert sum(1 for n in ran if n > 0) >= 2, ran  # the work really was shared
    assert Job.objects.count() == 0
