"""OpenTelemetry for the queue: a middleware (``RWS_JOBS["MIDDLEWARE"]``) that traces each enqueue
and each attempt, following OpenTelemetry's messaging conventions.

    pip install "django-rws-jobs[otel]"
    RWS_JOBS = {"MIDDLEWARE": ["django_rws_jobs.tracing.OpenTelemetryMiddleware"]}

- Each enqueue call is a PRODUCER span ``send {queue}`` (``send`` where the call stores jobs of
  several queues: ``enqueue_many``, ``chain``), started before the insert, so its duration is the
  enqueue's; ``enqueue_many`` is one span with ``messaging.batch.message_count``. The span's W3C
  context (``traceparent``, ``tracestate``, ``baggage``) goes into each job's metadata, under
  ``"_rws.otel"``.
- Each attempt is a CONSUMER span ``process {queue}`` with a link to the enqueue's context
  (``RWS_JOBS["OTEL_PARENT"] = "child"`` makes it the enqueue's child instead), and the attributes
  ``messaging.system`` (``rws_jobs``), ``messaging.destination.name``, ``messaging.message.id``,
  ``messaging.operation.type``, ``rws_jobs.job_type`` and ``rws_jobs.attempt``. A handler's
  exception is recorded on it, with the status ERROR.
- Nothing is traced, and the job's row is not read, unless the application has configured an
  OpenTelemetry SDK (``trace.set_tracer_provider``): until then the API's provider is a proxy
  that makes no spans (tests/test_tracing.py).
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind

from .conf import jobs_settings

#: The metadata key under which a job carries its enqueue's trace context.
CARRIER = "_rws.otel"
#: ``messaging.system``.
SYSTEM = "rws_jobs"


def _configured() -> bool:
    """Whether an SDK is configured: the global provider is no longer the API's proxy."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


class OpenTelemetryMiddleware:
    """See the module's docstring."""

    def __init__(self) -> None:
        self._tracer: trace.Tracer | None = None
        self._configured = False
        self._next_look = 0.0  # time.monotonic() of the next look, while no SDK is configured

    def _tracing(self) -> bool:
        """Whether to trace. A provider is set once per process, so a yes is kept; a no is looked
        at again a second later (the look reads the environment: a microsecond, too much for
        every job)."""
        if self._configured:
            return True
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + 1.0
        self._configured = _configured()
        return self._configured

    @property
    def tracer(self) -> trace.Tracer:
        if self._tracer is None:  # from the SDK's provider, once one is configured
            self._tracer = trace.get_tracer("django_rws_jobs")
        return self._tracer

    def enqueue(self, job: Any, call_next: Any) -> Any:
        if not self._tracing():
            return call_next()
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if job.queue is not None:
            attributes["messaging.destination.name"] = job.queue
        if job.job_type is not None:
            attributes["rws_jobs.job_type"] = job.job_type
        name = "send" if job.queue is None else f"send {job.queue}"
        with self.tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            if carrier:
                job.metadata[CARRIER] = carrier
            result = call_next()
            if job.many:
                span.set_attribute("messaging.batch.message_count", len(job.ids))
            elif job.ids:
                span.set_attribute("messaging.message.id", job.ids[0])
            return result

    def execute(self, job: Any, call_next: Any) -> Any:
        if not self._tracing():
            return call_next()

        carrier = job.metadata.get(CARRIER)
        sent = propagate.extract(carrier) if isinstance(carrier, dict) else None
        context, links = None, []
        if sent is not None:
            span_context = trace.get_current_span(sent).get_span_context()
            if span_context.is_valid:
                if jobs_settings.OTEL_PARENT == "child":
                    context = sent
                else:
                    links = [Link(span_context)]
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": job.id,
            "rws_jobs.job_type": job.job_type,
            "rws_jobs.attempt": job.attempt,
        }
        name = f"process {job.queue}"
        kind = SpanKind.CONSUMER
        with self.tracer.start_as_current_span(name, context, kind, attributes, links):
            return call_next()
