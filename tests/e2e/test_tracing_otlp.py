"""Tracing end to end: a real server started with --otlp-traces-endpoint exports its spans over OTLP/HTTP to a
receiver this test runs on 127.0.0.1 (decoding the OTLP protobuf), for a request made with the openai SDK that
carries the client's W3C traceparent."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.conftest import DEFAULT_MODEL, ServerProcess, one_model_server, smollm2_config

pytestmark = pytest.mark.slow

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"

LLM_CONFIG = smollm2_config(4096)


class Receiver:
    """An OTLP/HTTP trace receiver: keeps every exported span with its resource's service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                export = ExportTraceServiceRequest.FromString(body)
                for resource_spans in export.resource_spans:
                    service = next(
                        a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
                    )
                    for scope in resource_spans.scope_spans:
                        receiver.spans.extend((service, s) for s in scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture(scope="module")
def traced_server(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with one_model_server(
        tmp_path_factory.mktemp("traced_repository"),
        LLM_CONFIG,
        "--otlp-traces-endpoint",
        receiver.url,
        startup_timeout=300,
    ) as proc:
        yield proc


def test_a_chat_request_is_exported_under_the_clients_trace(traced_server: ServerProcess, receiver: Receiver) -> None:
    client = openai.OpenAI(base_url=f"{traced_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=4,
        extra_headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
    )
    assert reply.usage is not None
    deadline = time.monotonic() + 30
    ours: dict[str, object] = {}
    while time.monotonic() < deadline and len(ours) < 4:  # spans are exported in batches, every second
        ours = {
            s.name: s for service, s in receiver.spans if s.trace_id.hex() == CLIENT_TRACE and service == "switchyard"
        }
        time.sleep(0.2)
    assert set(ours) == {"llm_request", "queue", "prefill", "decode"}, [s.name for _, s in receiver.spans]
    root = ours["llm_request"]
    assert root.parent_span_id.hex() == CLIENT_SPAN
    assert all(ours[n].parent_span_id == root.span_id for n in ("queue", "prefill", "decode"))
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["gen_ai.usage.input_tokens"].int_value == reply.usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"].int_value == reply.usage.completion_tokens
    assert root.start_time_unix_nano <= ours["decode"].start_time_unix_nano <= root.end_time_unix_nano
