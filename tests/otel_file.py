"""An OpenTelemetry SDK for a worker process of the tests: every ended span is appended to a file,
one JSON object a line, which the test reads (tests/test_tracing.py)."""

from __future__ import annotations

import json
import os
import threading

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

_lock = threading.Lock()


def as_dict(span) -> dict:
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "links": [f"{link.context.trace_id:032x}:{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


class FileExporter(SpanExporter):
    def __init__(self, path: str):
        self.path = path

    def export(self, spans) -> SpanExportResult:
        with _lock, open(self.path, "a") as f:
            for span in spans:
                f.write(json.dumps(as_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def configure(path: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    trace.set_tracer_provider(provider)
