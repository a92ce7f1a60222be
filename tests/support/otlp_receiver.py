"""An OTLP/HTTP trace receiver on 127.0.0.1:<random port>: it takes what an OpenTelemetry exporter POSTs to
`/v1/traces` (protobuf `ExportTraceServiceRequest`, gzip or not), decodes it with the protocol's own generated
classes (opentelemetry-proto) and keeps each span as a dict, as a collector would read it."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):  # noqa: A002
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(404)
                    return
                receiver._keep(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True, name="otlp-receiver").start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests += 1
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(), "kind": span.kind,
                            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "links": [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                                      for link in span.links],
                            "status": span.status.code, "resource": resource,
                        })

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
