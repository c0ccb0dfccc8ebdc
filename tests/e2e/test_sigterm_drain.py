"""SIGTERM drains: in-flight requests finish, new ones get 503 with Retry-After, the process exits 0."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import openai

from tests.conftest import DEFAULT_MODEL, ROOT, ServerProcess

TOKENS = 400  # long enough that the streams are still running when the refused request comes (about 3 s at c=4)


def test_sigterm_drains_in_flight_requests_and_exits_zero() -> None:
    server = ServerProcess(ROOT / "model_repository", "--drain-seconds", "120")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    results: list[tuple[str | None, int]] = []
    errors: list[BaseException] = []
    streaming = threading.Barrier(5)

    def stream_one() -> None:
        try:
            chunks = client.completions.create(
                model=DEFAULT_MODEL,
                prompt="Once upon a time",
                max_tokens=TOKENS,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            pieces, reason = 0, None
            for i, chunk in enumerate(chunks):
                if i == 0:
                    streaming.wait(timeout=120)
                pieces += 1
                reason = chunk.choices[0].finish_reason or reason
            results.append((reason, pieces))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=stream_one) for _ in range(4)]
        for t in threads:
            t.start()
        streaming.wait(timeout=120)  # every stream has its first token
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        refused = httpx.post(server.base_url + "/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "x"})
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert refused.json()["error"]["code"] == "service_unavailable"
        assert httpx.get(server.base_url + "/v2/health/ready").status_code == 503
        assert httpx.get(server.base_url + "/v2/health/live").status_code == 200
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert results == [("length", TOKENS)] * 4
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.stop()
    assert "draining 4 request(s)" in server.log_path.read_text()
