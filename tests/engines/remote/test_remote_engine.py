"""RemoteEngine against scripted upstreams (real aiohttp servers on 127.0.0.1): retries, failover, usage,
logprobs, affinity, connection reuse.

The real-Switchyard counterpart is tests/e2e/test_remote_upstreams.py; these cover the failure shapes that are hard
to produce on demand with real model servers (a 500 before the first byte, a connection cut mid-stream, an error
event, a missing usage chunk).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import pytest
from aiohttp import web

from engines.interface import EngineUnavailableError, RequestRefusedError
from engines.remote.engine import RemoteEngine, RemoteSettings
from engines.remote.upstream import UpstreamSettings
from engines.remote.wire import completion_body
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, GuidedSpec, SamplingParams
from tests.char_tokenizer import EOS, CharTokenizer

HOSTS = ("up-a", "up-b")


def sse(*events: dict | str) -> list[bytes]:
    return [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events]


def chunk(text: str, finish: str | None = None, **extra: object) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish, **extra}]}


def usage(prompt: int, completion: int, cached: int = 0) -> dict:
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


@dataclass(frozen=True)
class Call:
    """One completion request as the upstream saw it."""

    host: str
    headers: Mapping[str, str]
    content: bytes
    peer_port: int  # the gateway's side of the connection: equal ports mean a reused connection


@dataclass(frozen=True)
class Reply:
    """A script's plain JSON answer (an error status, say)."""

    status: int
    body: dict


BREAK = object()  # in a script's parts: cut the connection here
DOWN = object()  # as a script: that upstream is not listening (connections are refused)

Script = Callable[[Call], object]


class Upstreams:
    """Two real HTTP servers, `up-a` and `up-b`, run by per-host scripts; records every request. A script returns
    the parts of a 200 event stream (bytes, or BREAK), or a Reply."""

    def __init__(self, **scripts: object) -> None:
        self.scripts = scripts
        self.calls: list[Call] = []
        self.deleted: list[str] = []
        self.health = dict.fromkeys(HOSTS, 200)
        self.url: dict[str, str] = {}
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        for host in HOSTS:
            if self.scripts[host.replace("-", "_")] is DOWN:
                with socket.socket() as probe:  # a port nothing listens on
                    probe.bind(("127.0.0.1", 0))
                    self.url[host] = f"http://127.0.0.1:{probe.getsockname()[1]}"
                continue
            app = web.Application()
            app.router.add_route("*", "/{path:.*}", lambda r, h=host: self._handle(h, r))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._runners.append(runner)
            self.url[host] = f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    async def _handle(self, host: str, request: web.Request) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(status=self.health[host])
        content = await request.read()
        if request.method == "DELETE":
            self.deleted.append(f"{host}{request.path}")
            return web.json_response({"deleted": True})
        call = Call(host, request.headers, content, request.transport.get_extra_info("peername")[1])
        self.calls.append(call)
        out = self.scripts[host.replace("-", "_")](call)  # type: ignore[operator]
        if isinstance(out, Reply):
            return web.json_response(out.body, status=out.status)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for part in out:  # type: ignore[attr-defined]
            if part is BREAK:
                request.transport.close()
                return resp
            await resp.write(part)
        await resp.write_eof()
        return resp

    def hosts(self) -> list[str]:
        return [c.host for c in self.calls]


def answer(text: str = "paris", finish: str = "stop", with_usage: bool = True) -> Script:
    def script(call: Call) -> list[bytes]:
        events: list[dict | str] = [chunk(c) for c in text[:-1]] + [chunk(text[-1], finish)]
        if with_usage:
            events.append(usage(len(json.loads(call.content)["prompt"]), len(text) + (finish == "stop")))
        return sse(*events, "[DONE]")

    return script


_cleanup: list[Upstreams | RemoteEngine] = []


@pytest.fixture(autouse=True)
async def _stop_servers_and_engines() -> AsyncIterator[None]:
    yield
    while _cleanup:
        item = _cleanup.pop()
        await (item.shutdown() if isinstance(item, RemoteEngine) else item.close())


async def engine_for(upstreams: Upstreams, retries: int = 2) -> RemoteEngine:
    await upstreams.start()
    _cleanup.append(upstreams)
    a, b = upstreams.url["up-a"], upstreams.url["up-b"] + "/v1"  # a trailing /v1 is accepted
    settings = RemoteSettings(
        [UpstreamSettings(a, connect_timeout=2.0), UpstreamSettings(b, connect_timeout=2.0)],
        model="m",
        retries=retries,
        health_check_seconds=3600,
    )
    engine = RemoteEngine(settings, CharTokenizer(), EngineInfo("remote", "remote", 512, 27, [EOS]))  # type: ignore[arg-type]
    await engine.start()
    _cleanup.append(engine)
    return engine


def request(
    rid: str = "r", session: str | None = None, prompt: list[int] | None = None, **sampling: object
) -> GenerationRequest:
    params = SamplingParams(**{"max_tokens": 8, "temperature": 0.0, **sampling})  # type: ignore[arg-type]
    return GenerationRequest(rid, prompt or [1, 2, 3], params, session_id=session)


async def collect(engine: RemoteEngine, req: GenerationRequest) -> list[GenerationOutput]:
    return [out async for out in engine.generate(req)]


def text_of(outs: list[GenerationOutput]) -> str:
    return "".join(o.text for o in outs)


async def test_streams_deltas_and_takes_usage_from_the_upstream() -> None:
    ups = Upstreams(up_a=answer("paris"), up_b=answer("paris"))
    engine = await engine_for(ups)
    outs = await collect(engine, request())
    assert text_of(outs) == "paris"
    assert [o.finished for o in outs] == [False] * 4 + [True]
    final = outs[-1]
    assert (final.finish_reason, final.prompt_tokens, final.completion_tokens) == ("stop", 3, 6)
    body = json.loads(ups.calls[0].content)
    assert body["prompt"] == [1, 2, 3] and body["stream"] and body["stream_options"] == {"include_usage": True}


async def test_the_stream_is_read_to_its_end_so_the_connection_is_reused() -> None:
    # Leaving anything after [DONE] unread (the chunked terminator, here also a comment) closes the connection:
    # every request would then open a new one to the upstream.
    def script(call: Call) -> list[bytes]:
        return [*sse(chunk("ok", "stop"), usage(3, 2), "[DONE]"), b": end of stream\n\n"]

    ups = Upstreams(up_a=script, up_b=DOWN)
    engine = await engine_for(ups, retries=0)
    engine.upstreams[1].mark_down("test: one upstream only")
    for i in range(3):
        outs = await collect(engine, request(str(i)))
        assert text_of(outs) == "ok" and outs[-1].finish_reason == "stop"
    assert len({c.peer_port for c in ups.calls}) == 1


async def test_events_split_across_writes_and_crlf_line_ends_are_reassembled() -> None:
    def ragged(call: Call) -> list[bytes]:
        whole = b"".join(sse(chunk("pa"), chunk("ris", "stop"), usage(3, 6), "[DONE]")).replace(b"\n", b"\r\n")
        return [whole[i : i + 7] for i in range(0, len(whole), 7)]

    engine = await engine_for(Upstreams(up_a=ragged, up_b=ragged))
    outs = await collect(engine, request())
    assert text_of(outs) == "paris" and outs[-1].completion_tokens == 6


async def test_a_line_without_end_fails_the_attempt_not_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engines.remote.engine.MAX_LINE_BYTES", 4096)
    ups = Upstreams(up_a=lambda c: [b"data: " + b"x" * 1024] * 8, up_b=answer("ok"))
    engine = await engine_for(ups)
    for i in range(2):  # whichever upstream is tried first, the answer comes from up-b
        assert text_of(await collect(engine, request(str(i)))) == "ok"
    assert "up-a" in ups.hosts()


async def test_without_usage_the_tokenizer_counts() -> None:
    ups = Upstreams(up_a=answer("lyon", with_usage=False), up_b=answer("abcdefgh", "length", with_usage=False))
    engine = await engine_for(ups)
    stopped = await collect(engine, request("1"))
    capped = await collect(engine, request("2", max_tokens=8))
    assert stopped[-1].completion_tokens == 5  # four characters plus the end-of-sequence token they stopped on
    assert capped[-1].finish_reason == "length" and capped[-1].completion_tokens == 8


async def test_least_outstanding_with_rotation_balances_sequential_requests() -> None:
    ups = Upstreams(up_a=answer(), up_b=answer())
    engine = await engine_for(ups)
    for i in range(6):
        await collect(engine, request(str(i)))
    assert sorted(ups.hosts()) == ["up-a"] * 3 + ["up-b"] * 3
    assert ups.hosts()[:2] in (["up-a", "up-b"], ["up-b", "up-a"])


async def test_the_trace_context_goes_upstream() -> None:
    ups = Upstreams(up_a=answer(), up_b=answer())
    engine = await engine_for(ups)
    req = request("traced")
    req.trace_headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    await collect(engine, req)
    assert ups.calls[0].headers["traceparent"] == req.trace_headers["traceparent"]
    await collect(engine, request("untraced"))
    assert "traceparent" not in ups.calls[1].headers


async def test_prompts_sharing_a_long_prefix_go_where_it_is_cached() -> None:
    ups = Upstreams(up_a=answer(), up_b=answer())
    engine = await engine_for(ups)
    tenants = [[t + 1] * 40 for t in range(2)]  # two "system prompts" of 40 tokens
    for i in range(6):
        await collect(engine, request(str(i), prompt=tenants[i % 2] + [20, i]))
    hosts = ups.hosts()
    assert hosts[0] != hosts[1]  # new prefixes spread by load ...
    assert hosts[2::2] == [hosts[0]] * 2 and hosts[3::2] == [hosts[1]] * 2  # ... then follow their cache


async def test_a_session_always_goes_to_the_same_upstream_and_carries_its_header() -> None:
    ups = Upstreams(up_a=answer(), up_b=answer())
    engine = await engine_for(ups)
    for i in range(4):
        await collect(engine, request(str(i), session="conversation-7"))
    assert len(set(ups.hosts())) == 1
    assert all(c.headers["x-session-id"] == "conversation-7" for c in ups.calls)
    assert engine.delete_session("conversation-7") and not engine.delete_session("never-seen")
    for _ in range(20):  # the upstream's KV session is released in the background
        await asyncio.sleep(0.01)
    assert ups.deleted == [f"{ups.hosts()[0]}/v1/sessions/conversation-7"]


async def test_connect_errors_and_5xx_before_the_first_byte_are_retried_elsewhere() -> None:
    ups = Upstreams(up_a=DOWN, up_b=answer("ok"))
    engine = await engine_for(ups)
    engine.upstreams[0].mark_up()  # it went down after the last health check: the request finds out
    pinned_to_a = next(f"s{i}" for i in range(100) if engine._router.affinity(f"s{i}") is engine.upstreams[0])
    outs = await collect(engine, request(session=pinned_to_a))  # even a pinned session fails over
    assert text_of(outs) == "ok" and ups.hosts() == ["up-b"]  # up-a refused the connection
    assert not engine.upstreams[0].healthy and engine.upstreams[1].healthy

    ups = Upstreams(up_a=lambda c: Reply(500, {"error": {"message": "boom"}}), up_b=answer("ok"))
    engine = await engine_for(ups)
    for i in range(2):
        assert text_of(await collect(engine, request(str(i)))) == "ok"
    assert "up-a" in ups.hosts()
    assert engine.upstreams[0].healthy  # a 500 may be this request's problem: the upstream stays in rotation


async def test_a_4xx_is_the_clients_problem_and_is_not_retried() -> None:
    ups = Upstreams(
        up_a=lambda c: Reply(400, {"error": {"message": "prompt too long"}}),
        up_b=lambda c: Reply(400, {"error": {"message": "prompt too long"}}),
    )
    engine = await engine_for(ups)
    with pytest.raises(ValueError, match="prompt too long"):
        await collect(engine, request())
    assert len(ups.calls) == 1


async def test_a_refusal_names_the_clients_field() -> None:
    """The upstream names fields of our completions body; the error names the client's: its `structured_outputs`
    is the field that asked for the spec, a vLLM grammar error (no param) too, `prompt` is nothing the client sent."""
    spec = GuidedSpec("lark", "start: nowhere", "response_format")
    cases = [
        ({"message": "bad", "param": "temperature"}, {}, "temperature"),
        ({"message": "bad", "param": "structured_outputs.grammar"}, {"guided": spec}, "response_format"),
        ({"message": "Invalid grammar specification"}, {"guided": spec}, "response_format"),
        ({"message": "Invalid grammar specification"}, {}, None),
        ({"message": "too long", "param": "prompt"}, {}, None),
    ]
    for error, sampling, param in cases:
        ups = Upstreams(up_a=lambda c, e=error: Reply(400, {"error": e}), up_b=DOWN)
        engine = await engine_for(ups, retries=0)
        with pytest.raises(RequestRefusedError) as refused:
            await collect(engine, request(**sampling))
        assert refused.value.param == param, error


async def test_when_every_attempt_fails_the_engine_is_unavailable() -> None:
    ups = Upstreams(up_a=lambda c: Reply(503, {"error": {"message": "loading"}}), up_b=DOWN)
    engine = await engine_for(ups)
    with pytest.raises(EngineUnavailableError, match="no upstream could serve"):
        await collect(engine, request())
    assert not engine.healthy  # both marked down: the model reports not ready until a health check succeeds
    ups.health = {"up-a": 200, "up-b": 503}
    await engine._check_all()
    assert engine.healthy and [u.healthy for u in engine.upstreams] == [True, False]


async def test_an_upstream_dying_mid_stream_ends_the_stream_cleanly() -> None:
    def dies(call: Call) -> list:
        return [*sse(chunk("pa"), chunk("r")), BREAK]

    ups = Upstreams(up_a=dies, up_b=dies)
    engine = await engine_for(ups)
    outs = await collect(engine, request())
    assert text_of(outs) == "par"  # what was sent stays sent; no retry after the first token
    assert outs[-1].finished and outs[-1].finish_reason == "abort" and "retry" in (outs[-1].error or "")
    assert len(ups.calls) == 1
    dead = {u.base_url: u.healthy for u in engine.upstreams}[ups.url[ups.calls[0].host]]
    assert dead is False  # the next request goes elsewhere


async def test_a_stream_that_breaks_before_the_first_token_is_retried() -> None:
    ups = Upstreams(up_a=lambda c: [BREAK], up_b=answer("ok"))
    engine = await engine_for(ups)
    for i in range(2):
        assert text_of(await collect(engine, request(str(i)))) == "ok"
    assert "up-a" in ups.hosts()


async def test_an_error_event_in_the_stream_fails_the_request() -> None:
    def errs(call: Call) -> list[bytes]:
        return sse(chunk("x"), {"error": {"message": "CUDA error", "type": "internal_error"}}, "[DONE]")

    engine = await engine_for(Upstreams(up_a=errs, up_b=errs))
    outs = await collect(engine, request())
    assert outs[-1].finish_reason == "error" and "CUDA error" in (outs[-1].error or "")


async def test_logprobs_map_back_to_token_ids() -> None:
    def with_logprobs(call: Call) -> list[bytes]:
        body = json.loads(call.content)
        assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
        lp_vllm = {"tokens": ["token_id:16"], "token_logprobs": [-0.5], "top_logprobs": [{"token_id:16": -0.5}]}
        lp_text = {"tokens": ["a"], "token_logprobs": [-1.5], "top_logprobs": [{"a": -1.5, "b": -2.0}]}
        return sse(chunk("p", logprobs=lp_vllm), chunk("a", "stop", logprobs=lp_text), usage(3, 2), "[DONE]")

    engine = await engine_for(Upstreams(up_a=with_logprobs, up_b=with_logprobs))
    outs = await collect(engine, request(logprobs=1))
    lps = [lp for o in outs for lp in (o.logprobs or [])]
    assert [(lp.token_id, lp.logprob, lp.top) for lp in lps] == [
        (16, -0.5, [(16, -0.5)]),
        (1, -1.5, [(1, -1.5), (2, -2.0)]),
    ]
    assert [t for o in outs for t in o.new_token_ids] == [16, 1]


def test_only_non_default_vllm_extras_are_sent() -> None:
    plain = completion_body("m", request())
    assert set(plain) == {"model", "prompt", "max_tokens", "temperature", "top_p", "stream", "stream_options"}
    rich = completion_body(
        "m",
        request(
            top_k=5,
            min_p=0.1,
            repetition_penalty=1.2,
            min_tokens=2,
            stop=["\n"],
            stop_token_ids=[7],
            ignore_eos=True,
            skip_special_tokens=False,
            seed=4,
            logit_bias={3: -100.0},
            presence_penalty=0.5,
        ),
    )
    assert {
        k: rich[k]
        for k in (
            "top_k",
            "min_p",
            "repetition_penalty",
            "min_tokens",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "skip_special_tokens",
            "seed",
            "logit_bias",
            "presence_penalty",
        )
    } == {
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "min_tokens": 2,
        "stop": ["\n"],
        "stop_token_ids": [7],
        "ignore_eos": True,
        "skip_special_tokens": False,
        "seed": 4,
        "logit_bias": {"3": -100.0},
        "presence_penalty": 0.5,
    }


def test_guided_decoding_is_forwarded_as_structured_outputs() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    cases = [
        (GuidedSpec("json", schema), {"json": schema}),
        (GuidedSpec("regex", "[0-9]+"), {"regex": "[0-9]+"}),
        (GuidedSpec("choice", ["yes", "no"]), {"choice": ["yes", "no"]}),
        (GuidedSpec("lark", 'start: "x"'), {"grammar": 'start: "x"'}),
    ]
    for spec, wire in cases:
        assert completion_body("m", request(guided=spec))["structured_outputs"] == wire
    assert "structured_outputs" not in completion_body("m", request())


def test_a_compiled_constraint_without_its_spec_is_refused_clearly() -> None:
    class Anything:
        def allowed_mask(self, vocab_size: int) -> None:
            return None

        def accept(self, token_id: int) -> None:
            pass

    with pytest.raises(ValueError, match="guided-decoding"):
        completion_body("m", request(constraint=Anything()))


async def test_a_dead_upstream_is_checked_with_backoff_and_comes_back() -> None:
    ups = Upstreams(up_a=answer(), up_b=DOWN)
    engine = await engine_for(ups)
    dead = engine.upstreams[1]
    assert not dead.healthy and dead.failed_checks == 1  # the first check at start failed
    delays = [dead.back_off(100.0, interval=0.5, ceiling=3.0) for _ in range(5)]
    assert delays == [1.0, 2.0, 3.0, 3.0, 3.0]  # doubling per failure in a row, up to the ceiling
    assert not dead.check_due(102.9) and dead.check_due(103.0)
    assert engine.upstreams[0].check_due(0.0)  # a serving upstream is checked at every interval
    dead.mark_up()
    assert dead.failed_checks == 0 and dead.check_due(0.0)
