"""OpenTelemetry traces (opentelemetry-sdk, OTLP over HTTP): off unless OTEL_EXPORTER_OTLP_ENDPOINT (spans go
to its /v1/traces) or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the full URL) is set; then every request is a
server span named by its route template (`GET /v1/tenants/{tenant}`), continuing the caller's W3C
`traceparent`, with a child span for each authorization decision. The exporter reads the other standard
OTEL_* variables itself (headers, timeout, compression); OTEL_SERVICE_NAME names the service
(default `trustfabric`).

Each app keeps its own tracer provider (nothing global is set), so nothing is imported or exported when
tracing is off, and two apps in one process never share spans.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from workflows.settings import Settings


class Tracing:
    """The app's tracer and provider (flushed and shut down with the app)."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("trustfabric.api")

    @contextmanager
    def server_span(self, method: str, headers: Mapping[str, str]) -> Iterator[Span]:
        """A server span continuing the caller's trace context (`traceparent`), current while it runs."""
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span(f"{method}", context=extract(dict(headers)), kind=SpanKind.SERVER,
                                               record_exception=False, set_status_on_exception=True) as span:
            yield span

    def flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()


def setup(settings: Settings) -> Tracing | None:
    """A Tracing exporting OTLP/HTTP batches when an endpoint is configured; None (and no import) otherwise."""
    if not settings.otel_endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": settings.otel_service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otel_endpoint)))
    return Tracing(provider)


def span(tracing: Tracing | None, name: str, **attributes: Any) -> Any:
    """A child span of the current one (a no-op context when tracing is off)."""
    if tracing is None:
        return nullcontext()
    return tracing.tracer.start_as_current_span(name, attributes=attributes)
