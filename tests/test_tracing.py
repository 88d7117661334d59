"""OpenTelemetry (django_rws_jobs.tracing): a "send" span per enqueue, a "process" span per
attempt linked to it, through tick() and a real worker process, with the real SDK."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

import django_rws_jobs as rws
from django_rws_jobs.models import Job
from django_rws_jobs.tracing import CARRIER
from tests.test_worker import wait_for, workers  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)

MIDDLEWARE = ["django_rws_jobs.tracing.OpenTelemetryMiddleware"]


def _unset(monkeypatch) -> None:
    """No provider set (the API's own state, as at a process's start)."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())


@pytest.fixture
def spans(monkeypatch, settings):
    """An SDK with an in-memory exporter, and the tracing middleware."""
    _unset(monkeypatch)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    settings.RWS_JOBS = {**settings.RWS_JOBS, "MIDDLEWARE": MIDDLEWARE}
    yield exporter
    provider.shutdown()


def by_name(exporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_nothing_is_traced_without_an_sdk(monkeypatch, settings):
    _unset(monkeypatch)
    settings.RWS_JOBS = {**settings.RWS_JOBS, "MIDDLEWARE": MIDDLEWARE}
    job_id = rws.enqueue("test.record", "x")
    assert Job.objects.get(id=job_id).metadata is None  # no carrier, nothing stored
    assert rws.tick()


def test_an_enqueue_and_its_attempt_are_linked_spans(spans):
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        job_id = rws.enqueue("test.record", "x", queue="mail", metadata={"tenant": 3})
    carrier = Job.objects.get(id=job_id).metadata[CARRIER]
    assert set(carrier) >= {"traceparent"}
    assert rws.tick(queues=["mail"])
    found = by_name(spans)
    send, process = found["send mail"], found["process mail"]
    assert send.kind == SpanKind.PRODUCER
    assert send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes) == {
        "messaging.system": "rws_jobs",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "mail",
        "rws_jobs.job_type": "test.record",
        "messaging.message.id": job_id,
    }
    assert process.kind == SpanKind.CONSUMER
    assert process.parent is None  # a trace of its own ...
    assert [link.context.span_id for link in process.links] == [send.context.span_id]  # ... linked
    assert process.context.trace_id != send.context.trace_id
    assert dict(process.attributes) == {
        "messaging.system": "rws_jobs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": job_id,
        "rws_jobs.job_type": "test.record",
        "rws_jobs.attempt": 1,
    }
    assert process.status.status_code == StatusCode.UNSET


def test_otel_parent_child_makes_the_attempt_the_enqueues_child(spans, settings):
    settings.RWS_JOBS = {**settings.RWS_JOBS, "OTEL_PARENT": "child"}
    rws.enqueue("test.record", "x")
    assert rws.tick()
    found = by_name(spans)
    assert found["process default"].parent.span_id == found["send default"].context.span_id
    assert found["process default"].context.trace_id == found["send default"].context.trace_id
    assert found["process default"].links == ()


def test_enqueue_many_is_one_span_with_a_count(spans):
    ids = rws.enqueue_many(["test.record", ("test.record", "b"), {"job_type": "test.record", "queue": "q2"}])
    (send,) = spans.get_finished_spans()
    assert send.name == "send"
    assert send.attributes["messaging.batch.message_count"] == 3
    carriers = {json.dumps(Job.objects.get(id=i).metadata[CARRIER]) for i in ids}
    assert len(carriers) == 1


def test_a_failed_attempt_records_its_error(spans):
    rws.enqueue("test.fail", "x", max_retries=0)
    assert rws.tick()
    process = by_name(spans)["process default"]
    assert process.status.status_code == StatusCode.ERROR
    assert [e.name for e in process.events] == ["exception"]
    assert process.events[0].attributes["exception.type"] == "ValueError"


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_worker_process_links_each_attempt_to_its_enqueue(spans, workers, pool, tmp_path):  # noqa: F811
    path = tmp_path / "spans.jsonl"
    ids = [rws.enqueue("test.record", str(i)) for i in range(3)]
    failing = rws.enqueue("test.fail", "f", max_retries=0)
    sent = {s.attributes["messaging.message.id"]: s for s in spans.get_finished_spans()}
    w = workers(
        "--workers",
        "2",
        "--pool",
        pool,
        "--burst",
        jobs={"MIDDLEWARE": MIDDLEWARE},
        env={"RWS_TEST_OTEL_FILE": str(path)},
    )
    assert w.wait() == 0, w.output()
    processed = {
        s["attributes"]["messaging.message.id"]: s
        for s in map(json.loads, path.read_text().splitlines())
        if s["name"] == "process default"
    }
    assert set(processed) == {*ids, failing}
    for job_id, span in processed.items():
        sender = sent[job_id].context
        assert span["kind"] == "CONSUMER"
        assert span["links"] == [f"{sender.trace_id:032x}:{sender.span_id:016x}"]
        assert span["status"] == ("ERROR" if job_id == failing else "UNSET")
    if pool == "processes":
        assert all(s["pid"] != w.proc.pid for s in processed.values())  # traced in the children


COPIED = {CARRIER: {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "tenant": 3}


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many", "chain"])
def test_the_callers_trace_context_wins_over_a_copied_one(spans, call):
    """A job whose metadata carries another enqueue's context (copied from a running job's
    metadata) gets the context of the call that enqueues it, whichever call that is; its other
    keys stay."""
    if call == "enqueue":
        ids = [rws.enqueue("test.record", "x", metadata=dict(COPIED))]
    elif call == "enqueue_many":
        ids = rws.enqueue_many([{"job_type": "test.record", "metadata": dict(COPIED)}, "test.record"])
    else:
        ids = rws.chain(rws.call("test.record", "a", metadata=dict(COPIED)), rws.call("test.record", "b"))
    (send,) = spans.get_finished_spans()
    ours = [f"{send.context.trace_id:032x}", f"{send.context.span_id:016x}"]
    for job_id in ids:
        metadata = Job.objects.get(id=job_id).metadata
        assert metadata[CARRIER]["traceparent"].split("-")[1:3] == ours, call
    assert Job.objects.get(id=ids[0]).metadata["tenant"] == 3
