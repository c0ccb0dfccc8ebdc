"""`RemoteEngine`: forwards each sequence to one of several upstream OpenAI-compatible servers and streams back.

Per request: pick an upstream (routing.py), POST a streaming `/v1/completions` with the prompt's token ids
(wire.py), and turn its chunks into `GenerationOutput` updates. Until the first token has been passed on, a
connect error, a timeout, a broken stream, a 408/429 or a 5xx is retried on another upstream (`retries` times);
after that a failure ends the stream cleanly with finish_reason "abort" (retryable, 503) -- text already sent to
a client cannot be taken back. Closing the stream closes the upstream connection, which aborts the request there.

Usage comes from the upstream (we always ask for `stream_options.include_usage`). An upstream that sends none is
counted with the model's tokenizer: the completion text's tokens, plus one for an end-of-sequence token when the
upstream says it stopped on one. (tiktoken is no fallback here: its encodings are downloaded at run time, and the
gateway needs the model's own tokenizer anyway to render chat templates.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from engines.hf_tokenizer import HFTokenizer
from engines.interface import AsyncGenerateEngine, EngineUnavailableError, RequestRefusedError, Tokenizer
from engines.remote.routing import Router, RoutingSettings
from engines.remote.tokenizer import load_tokenizer
from engines.remote.upstream import TRANSPORT_ERRORS, Upstream, UpstreamSettings
from engines.remote.wire import Delta, TokenIds, UpstreamError, completion_body, parse_chunk, sse_data
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, TokenLogprob

log = logging.getLogger("switchyard.engines.remote")

MAX_TRACKED_SESSIONS = 65536
MAX_ERROR_CHARS = 300
DRAIN_TIMEOUT_S = 1.0
MAX_LINE_BYTES = 4 << 20  # an SSE line longer than this is not a chunk any upstream sends: fail the attempt


@dataclass(frozen=True)
class RemoteSettings:
    """A remote model: its upstreams, the name they serve it under, and how hard to try."""

    upstreams: list[UpstreamSettings]
    model: str
    retries: int = 2  # extra attempts on other upstreams before the first token
    health_check_seconds: float = 5.0
    health_backoff_max_seconds: float = 30.0  # longest wait between checks of an upstream that stays down
    api_key: str | None = None  # sent as `Authorization: Bearer ...` to every upstream
    routing: RoutingSettings = field(default_factory=RoutingSettings)


class _Retry(Exception):
    """This attempt failed before anything reached the caller: try another upstream."""


@dataclass
class _Progress:
    """One sequence's state across the chunks of one attempt."""

    text: str = ""
    tokens: int = 0  # estimate until the upstream's usage arrives
    started: bool = False  # an update has been passed on (no retry after this)
    finish_reason: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None
    held_text: str = ""  # text that arrived with or after the finish, sent with the final update
    held_logprobs: list[TokenLogprob] = field(default_factory=list)


class RemoteEngine(AsyncGenerateEngine):
    def __init__(self, settings: RemoteSettings, tokenizer: HFTokenizer, info: EngineInfo) -> None:
        if not settings.upstreams:
            raise ValueError("a remote model needs at least one upstream URL")
        self._settings = settings
        self._tokenizer = tokenizer
        self._info = info
        self._router = Router([Upstream(u) for u in settings.upstreams], settings.routing)
        self._token_ids = TokenIds(tokenizer)
        self._headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._client: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._aborted: set[str] = set()
        self._sessions: OrderedDict[str, None] = OrderedDict()  # sessions seen, for delete_session
        self._background: set[asyncio.Task[None]] = set()

    # -- AsyncGenerateEngine -------------------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def upstreams(self) -> list[Upstream]:
        return self._router.upstreams

    @property
    def healthy(self) -> bool:
        return any(u.healthy for u in self._router.upstreams)

    @property
    def enforces_guided_spec(self) -> bool:
        return True  # forwarded as `structured_outputs` (wire.py)

    async def start(self) -> None:
        # aiohttp, not httpx: measured on this relay at 8 streams of 50 tokens/s, httpx spent 0.33 ms of CPU per
        # token and 2.5 ms per request, aiohttp 0.09 and 0.7 -- the gateway shares the upstream's CPUs.
        # No connection cap here: the admission scheduler bounds requests in flight, and a pool wait would
        # wrongly look like a dead upstream. No cookies: upstreams are stateless APIs.
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(), raise_for_status=False
        )
        await self._check_all()
        self._health_task = asyncio.create_task(self._health_loop(), name="switchyard-remote-health")

    async def shutdown(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self._client is not None:
            await self._client.close()

    async def abort(self, request_id: str) -> None:
        # The caller closes our stream, which closes the upstream connection; this only stops a stream that is
        # still being read by someone else.
        self._aborted.add(request_id)
        if len(self._aborted) > 4096:
            self._aborted.clear()

    def delete_session(self, session_id: str) -> bool:
        if session_id not in self._sessions:
            return False
        del self._sessions[session_id]
        upstream = self._router.affinity(session_id)
        if upstream is not None and self._client is not None:  # release its KV session there too (best effort)
            task = asyncio.get_running_loop().create_task(self._delete_upstream_session(upstream, session_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return True

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if self._client is None:
            raise EngineUnavailableError("the remote engine is not started")
        body = completion_body(self._settings.model, request)
        headers = {**self._headers, **request.trace_headers}  # the caller's W3C trace context goes upstream
        if request.session_id:
            headers["X-Session-ID"] = request.session_id
            self._sessions[request.session_id] = None
            self._sessions.move_to_end(request.session_id)
            while len(self._sessions) > MAX_TRACKED_SESSIONS:
                self._sessions.popitem(last=False)
        tried: list[Upstream] = []
        failures: list[str] = []
        for _ in range(1 + max(0, self._settings.retries)):
            upstream = self._router.pick(request.session_id, tried, request.prompt_token_ids)
            if upstream is None:
                break
            tried.append(upstream)
            upstream.outstanding += 1
            try:
                async with contextlib.aclosing(self._attempt(upstream, body, headers, request)) as updates:
                    async for out in updates:
                        yield out
                return
            except _Retry as exc:
                failures.append(str(exc))
                log.info("request %s: %s; trying another upstream", request.request_id, exc)
            finally:
                upstream.outstanding -= 1
        reason = "; ".join(failures[-3:]) if failures else "no upstream is healthy"
        raise EngineUnavailableError(f"no upstream could serve the request ({reason})"[:1000])

    # -- one attempt on one upstream ------------------------------------------------------------------------------
    async def _attempt(
        self, upstream: Upstream, body: dict[str, Any], headers: dict[str, str], request: GenerationRequest
    ) -> AsyncIterator[GenerationOutput]:
        assert self._client is not None
        url = f"{upstream.base_url}/v1/completions"
        p = _Progress()
        try:
            async with self._client.post(url, json=body, headers=headers, timeout=upstream.timeout) as resp:
                if resp.status != 200:
                    detail, param = await _error_detail(resp)
                    if resp.status in (408, 429) or resp.status >= 500:
                        if resp.status == 503:
                            upstream.mark_down(f"answered 503: {detail}")
                        raise _Retry(f"{upstream.base_url} answered {resp.status}: {detail}")
                    raise RequestRefusedError(
                        f"the upstream refused the request: {detail}", _client_param(param, detail, request)
                    )
                upstream.served += 1
                lines = _lines(resp)
                async for line in lines:
                    data = sse_data(line)
                    if data is None:
                        continue
                    if data.strip() == "[DONE]":
                        await _drain(lines)
                        break
                    if request.request_id in self._aborted:
                        self._aborted.discard(request.request_id)
                        return
                    try:
                        delta = parse_chunk(data, self._token_ids)
                    except (UpstreamError, ValueError) as exc:
                        yield self._final(request, p, "error", f"the upstream failed: {str(exc)[:MAX_ERROR_CHARS]}")
                        return
                    update = self._apply(request, p, delta)
                    if update is not None:
                        p.started = True
                        yield update
        except TRANSPORT_ERRORS as exc:
            what = f"{exc.__class__.__name__}" + (f": {exc}" if str(exc) else "")
            if p.finish_reason is None:
                upstream.mark_down(what[:MAX_ERROR_CHARS])
                if not p.started:
                    raise _Retry(f"{upstream.base_url} failed ({what[:MAX_ERROR_CHARS]})") from None
                yield self._final(
                    request, p, "abort", "the upstream serving this request failed mid-response; retry the request"
                )
                return
            # The stream broke after the finish (only the usage chunk or [DONE] was lost): the answer is whole.
        if p.finish_reason is None:
            if not p.started:
                raise _Retry(f"{upstream.base_url} ended its stream before answering")
            yield self._final(request, p, "abort", "the upstream ended its stream before finishing; retry the request")
            return
        yield self._final(request, p, p.finish_reason, None)

    def _apply(self, request: GenerationRequest, p: _Progress, delta: Delta) -> GenerationOutput | None:
        """Fold a chunk into the progress; return the update to pass on now, if any."""
        if delta.usage is not None:
            p.usage = delta.usage
        if p.finish_reason is not None or delta.finish_reason is not None:
            # Hold the finish until the usage chunk (or the end) so the final update carries exact counts.
            p.finish_reason = p.finish_reason or delta.finish_reason
            p.stop_reason = delta.stop_reason if delta.finish_reason else p.stop_reason
            p.held_text += delta.text
            p.held_logprobs.extend(delta.logprobs)
            p.text += delta.text
            p.tokens += len(delta.logprobs) or (1 if delta.text else 0)
            return None
        if not delta.text and not delta.logprobs:
            return None
        p.text += delta.text
        p.tokens += len(delta.logprobs) or 1
        return GenerationOutput(
            request_id=request.request_id,
            new_token_ids=[lp.token_id for lp in delta.logprobs],
            text=delta.text,
            prompt_tokens=len(request.prompt_token_ids),
            completion_tokens=p.tokens,
            logprobs=delta.logprobs or None,
        )

    def _final(self, request: GenerationRequest, p: _Progress, reason: str, error: str | None) -> GenerationOutput:
        usage = p.usage or {}
        completion = usage.get("completion_tokens")
        if not isinstance(completion, int):
            completion = self._count(request, p) if error is None else p.tokens
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return GenerationOutput(
            request_id=request.request_id,
            new_token_ids=[lp.token_id for lp in p.held_logprobs],
            text=p.held_text if error is None else "",
            finished=True,
            finish_reason=reason,
            prompt_tokens=len(request.prompt_token_ids),
            completion_tokens=completion,
            cached_prompt_tokens=cached if isinstance(cached, int) else 0,
            logprobs=(p.held_logprobs or None) if error is None else None,
            error=error,
        )

    def _count(self, request: GenerationRequest, p: _Progress) -> int:
        """Completion tokens when the upstream sent no usage: "length" means the cap was reached; otherwise count
        the text with the model's tokenizer, plus the end-of-sequence token it stopped on (not in the text)."""
        if p.finish_reason == "length":
            return request.sampling.max_tokens
        count = len(self._tokenizer.encode(p.text, add_special_tokens=False)) if p.text else 0
        stopped_on_token = p.finish_reason == "stop" and not isinstance(p.stop_reason, str)
        return count + (1 if stopped_on_token else 0)

    # -- health ---------------------------------------------------------------------------------------------------
    async def _check_all(self) -> None:
        await self._check(self._router.upstreams)

    async def _check(self, upstreams: list[Upstream]) -> None:
        """Check `upstreams` at once; each that fails backs off before its next check."""
        assert self._client is not None
        results = await asyncio.gather(*(u.check(self._client, self._headers) for u in upstreams))
        now = time.monotonic()
        for upstream, ok in zip(upstreams, results, strict=True):
            if not ok:
                upstream.back_off(now, self._settings.health_check_seconds, self._settings.health_backoff_max_seconds)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.health_check_seconds)
            try:
                now = time.monotonic()
                await self._check([u for u in self._router.upstreams if u.check_due(now)])
            except Exception:  # a bug here must not stop health checking for good
                log.exception("remote health check failed")

    async def _delete_upstream_session(self, upstream: Upstream, session_id: str) -> None:
        assert self._client is not None
        try:
            async with self._client.delete(
                f"{upstream.base_url}/v1/sessions/{session_id}", headers=self._headers, timeout=upstream.timeout
            ) as resp:
                await resp.read()
        except TRANSPORT_ERRORS:
            log.debug("deleting session on %s failed", upstream.base_url, exc_info=True)


async def _lines(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The body's lines as they arrive (LF or CRLF endings). A line that grows past MAX_LINE_BYTES fails the
    attempt instead of the gateway's memory."""
    pending = b""
    async for data in resp.content.iter_any():
        *complete, pending = (pending + data).split(b"\n")
        for line in complete:
            yield line.removesuffix(b"\r").decode("utf-8", "replace")
        if len(pending) > MAX_LINE_BYTES:
            raise aiohttp.ClientPayloadError(f"an SSE line longer than {MAX_LINE_BYTES} bytes")
    if pending:
        yield pending.decode("utf-8", "replace")


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read the (empty) rest of a finished stream, so its connection goes back to the pool: leaving the body
    unread closes the connection, and every request would then pay a new connection to the upstream.
    Bounded: an upstream that keeps the stream open after `[DONE]` only loses its connection."""
    with contextlib.suppress(*TRANSPORT_ERRORS):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in lines:
                pass


async def _error_detail(resp: aiohttp.ClientResponse) -> tuple[str, str | None]:
    """The message of an upstream's error response, short and without its internals, and its `param`."""
    try:
        obj = json.loads(await resp.read())
        err = obj.get("error") if isinstance(obj, dict) else None
        message = err.get("message") if isinstance(err, dict) else (err or obj.get("message") or obj.get("detail"))
        param = err.get("param") if isinstance(err, dict) else None
        return str(message)[:MAX_ERROR_CHARS], param if isinstance(param, str) else None
    except Exception:
        return f"HTTP {resp.status}", None


_GUIDED_WORDS = re.compile(r"grammar|schema|regex|structured|choice", re.IGNORECASE)


def _client_param(param: str | None, detail: str, request: GenerationRequest) -> str | None:
    """The client's field an upstream refusal is about. The upstream names fields of our completions body: its
    sampling fields are the client's, its `structured_outputs` is whatever field asked for the guided spec, and
    `prompt` (token ids we built) names nothing the client sent. vLLM's grammar checks name no field at all, so a
    refusal of a guided request that speaks of grammars or schemas is taken to be about the spec."""
    guided = request.sampling.guided
    if param is None:
        return guided.param if guided is not None and _GUIDED_WORDS.search(detail) else None
    if param.startswith("structured_outputs"):
        return guided.param if guided is not None else None
    return None if param.startswith("prompt") else param


def probe_max_model_len(settings: RemoteSettings) -> int | None:
    """Ask the upstreams' `/v1/models` for the model's context length (vLLM and Switchyard report it). Blocking:
    it runs once, while the model loads."""
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    for up in settings.upstreams:
        try:
            ask = urllib.request.Request(f"{up.base_url}/v1/models", headers=headers)
            with urllib.request.urlopen(
                ask, timeout=up.connect_timeout + 2.0
            ) as resp:  # a URL from config, never from a request
                entries = json.loads(resp.read()).get("data") or []
        except (OSError, urllib.error.URLError, ValueError, AttributeError):
            continue
        for entry in entries:
            if isinstance(entry, dict) and entry.get("id") == settings.model:
                value = entry.get("max_model_len")
                if isinstance(value, int) and value > 0:
                    return value
        names = [e.get("id") for e in entries if isinstance(e, dict)]
        log.warning("upstream %s does not list model '%s' (it serves %s)", up.base_url, settings.model, names)
    return None


def build_remote_engine(
    settings: RemoteSettings, tokenizer_source: Path, cache_dir: Path, max_model_len: int | None = None
) -> RemoteEngine:
    """Load the tokenizer and learn the context length (blocking). ValueError says what to configure."""
    tokenizer = load_tokenizer(tokenizer_source, cache_dir)
    if max_model_len is None:
        max_model_len = probe_max_model_len(settings)
    if max_model_len is None:
        raise ValueError(
            "no upstream reported the model's context length (GET /v1/models with max_model_len); "
            "set max_model_len in the model's config"
        )
    hf = tokenizer.hf
    eos = [hf.eos_token_id] if getattr(hf, "eos_token_id", None) is not None else []
    info = EngineInfo(
        model_type="remote",
        dtype="remote",
        max_model_len=max_model_len,
        vocab_size=tokenizer.vocab_size,
        eos_token_ids=eos,
    )
    return RemoteEngine(settings, tokenizer, info)
