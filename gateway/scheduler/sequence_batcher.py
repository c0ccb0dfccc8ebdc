"""Continuous batching for step engines, at iteration level (vLLM V1's scheduling model).

Every step: running sequences get their next tokens first (one for a decode, a chunk for an unfinished prefill),
then waiting sequences are admitted in (priority, arrival) order while the token budget, the sequence cap and
the KV pool allow. When the pool runs dry, the most recently admitted running sequence is preempted: its blocks
are freed and it is recomputed later from its prompt plus what it already generated. Requests are never failed
for lack of KV space and the scheduler never waits on itself.

All state is touched only on the event loop; the model step runs in one worker thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engines.interface import StepEngine, Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, SequenceStep, StepResult
from gateway.errors import RateLimitError, ServiceUnavailableError
from gateway.kv_cache.manager import KVCacheManager
from gateway.kv_cache.sessions import SessionStore
from gateway.scheduler.llm_scheduler import LLMScheduler, SchedulerStats, admission_key
from gateway.scheduler.output_processor import OutputProcessor

log = logging.getLogger("switchyard.scheduler")


@dataclass
class BatcherLimits:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    # False: every prompt is prefilled whole; the first one a step admits may take it past max_num_batched_tokens
    enable_chunked_prefill: bool = True
    max_queue_size: int = 1024
    enable_prefix_caching: bool = True
    aging_seconds: float = 30.0  # a request waiting longer than this is admitted ahead of every priority
    session_ttl_seconds: float = 600.0
    session_max_tokens: int | None = None  # pinned-session cap; default a quarter of the KV pool


@dataclass
class _Sequence:
    request: GenerationRequest
    processor: OutputProcessor
    queue: asyncio.Queue[GenerationOutput]
    order: int
    tokens: list[int] = field(default_factory=list)  # prompt + output
    num_computed: int = 0  # tokens already in the KV cache
    aborted: bool = False
    finished: bool = False
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    block_hashes: list[bytes] = field(default_factory=list)  # digests of its full blocks, computed once each

    @property
    def seq_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt_token_ids)

    def sort_key(self, now: float, aging_seconds: float) -> tuple[float, int]:
        return admission_key(self.request, self.order, now, aging_seconds)


class SequenceBatcher(LLMScheduler):
    def __init__(self, engine: StepEngine, limits: BatcherLimits | None = None) -> None:
        self._engine = engine
        self._limits = limits or BatcherLimits()
        info = engine.info
        self._kv = KVCacheManager(info.num_kv_blocks, info.block_size, self._limits.enable_prefix_caching)
        max_session_tokens = self._limits.session_max_tokens or info.num_kv_blocks * info.block_size // 4
        self._sessions = SessionStore(
            self._kv.pool, self._limits.session_ttl_seconds, max(0, max_session_tokens // info.block_size)
        )
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._order = itertools.count()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-step")
        self._task: asyncio.Task[None] | None = None
        self._stats = SchedulerStats(kv_blocks_total=info.num_kv_blocks)
        # outputs of the last step (and finishes), handed to their streams by _flush
        self._outbox: list[tuple[asyncio.Queue[GenerationOutput], GenerationOutput]] = []

    # -- LLMScheduler -------------------------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        return self._engine.info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._engine.tokenizer

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="switchyard-sequence-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for seq in [*self._running, *self._waiting]:
            self._finish(seq, "abort", error="the model was unloaded")
        self._flush()
        self._executor.shutdown(wait=True)
        self._engine.shutdown()

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._task.done()

    def stats(self) -> SchedulerStats:
        self._stats.running = len(self._running)
        self._stats.waiting = len(self._waiting)
        self._stats.kv_blocks_used = self._kv.pool.num_used
        self._stats.prefix_cache_queried_tokens = self._kv.prefix_stats.queried_tokens
        self._stats.prefix_cache_hit_tokens = self._kv.prefix_stats.hit_tokens
        self._stats.sessions = len(self._sessions)
        self._stats.session_pinned_blocks = self._sessions.pinned_blocks
        return self._stats

    def delete_session(self, session_id: str) -> bool:
        return self._sessions.release(session_id)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return self._stats.requests.observe(request, self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        seq = self._add(request)
        try:
            while True:
                out = await seq.queue.get()
                yield out
                if out.finished:
                    return
        finally:
            if not seq.finished:
                seq.aborted = True
                self._wakeup.set()

    # -- admission ----------------------------------------------------------------------------------------------
    def _add(self, request: GenerationRequest) -> _Sequence:
        if self._task is None or self._task.done():
            raise ServiceUnavailableError("the model is not running; try again later", headers={"Retry-After": "5"})
        if len(self._waiting) >= self._limits.max_queue_size:
            raise RateLimitError("the model's queue is full; retry shortly", headers={"Retry-After": "1"})
        if request.request_id in self._by_id:
            raise ValueError(f"duplicate request id {request.request_id}")
        info = self._engine.info
        processor = OutputProcessor(self.tokenizer, request.prompt_token_ids, request.sampling, info.eos_token_ids)
        seq = _Sequence(request, processor, asyncio.Queue(), next(self._order), list(request.prompt_token_ids))
        if not request.arrival_time:
            request.arrival_time = time.monotonic()
        self._waiting.append(seq)
        self._by_id[seq.seq_id] = seq
        self._wakeup.set()
        return seq

    # -- the step loop ------------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            try:
                await self._iteration()
            except asyncio.CancelledError:
                raise
            except Exception:
                # A scheduling bug must not strand requests: fail everything in flight and keep serving.
                log.exception("scheduler iteration failed; failing %d in-flight sequences",
                              len(self._running) + len(self._waiting))
                for seq in [*self._running, *self._waiting]:
                    self._finish(seq, "error", error="internal scheduler error; see the server log")
                self._flush()

    async def _iteration(self) -> None:
        self._reap_aborted()
        self._sessions.expire()
        if not self._running and not self._waiting:
            self._flush()
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=1.0)
            except TimeoutError:
                pass
            return
        batch = self._schedule()
        if not batch:
            # Nothing fits right now (blocks are held by sequences being aborted); back off instead of spinning.
            self._flush()
            await asyncio.sleep(0.01)
            return
        steps = [step for _, step in batch]
        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def step() -> StepResult:
            loop.call_soon_threadsafe(started.set)
            return self._engine.execute(steps)

        try:
            future = loop.run_in_executor(self._executor, step)
            if self._outbox:
                # The last step's outputs wake their streams only once this step's thread holds the GIL: woken
                # first, their Python (detokenized text, SSE) kept the step waiting for it 2-3 ms per step.
                await started.wait()
                self._flush()
            result = await future
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("model step failed; failing the %d sequences in it", len(batch))
            for seq, _ in batch:
                self._finish(seq, "error", error="the model failed while generating; see the server log")
            return
        self._stats.steps += 1
        self._update(batch, result)

    def _reap_aborted(self) -> None:
        for seq in [s for s in (*self._running, *self._waiting) if s.aborted]:
            self._finish(seq, "abort")

    def _schedule(self) -> list[tuple[_Sequence, SequenceStep]]:
        budget = self._limits.max_num_batched_tokens
        scheduled: list[tuple[_Sequence, SequenceStep]] = []
        now = time.monotonic()
        aging = self._limits.aging_seconds
        running = sorted(self._running, key=lambda s: s.sort_key(now, aging))
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            n = min(len(seq.tokens) - seq.num_computed, budget)
            while self._kv.allocate(seq.seq_id, seq.num_computed + n) is None:
                victim = running.pop()  # lowest priority, latest arrival
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append((seq, self._step(seq, n)))
                budget -= n
                i += 1
                continue
            break
        self._waiting.sort(key=lambda s: s.sort_key(now, aging))
        # Requests whose next uncached block is being prefilled right now (n>1 choices, one system prompt for many
        # chats) wait until that prefill commits it, then find it in the cache instead of computing it again; all
        # of them in the step after the commit, as the budget allows.
        computing = self._blocks_in_flight()
        chunked, admitted = self._limits.enable_chunked_prefill, False
        i = 0
        while (i < len(self._waiting) and (budget > 0 or not (chunked or admitted))
               and len(self._running) < self._limits.max_num_seqs):
            seq = self._waiting[i]
            if seq.num_computed == 0:
                if computing and self._needs_block_in_flight(seq, computing):
                    i += 1
                    continue
                seq.num_computed = self._kv.admit(seq.seq_id, seq.tokens, seq.block_hashes)
                if seq.request.session_id:
                    self._sessions.touch(seq.request.session_id)
                if not seq.processor.num_tokens:
                    seq.cached_tokens = seq.num_computed
            n = len(seq.tokens) - seq.num_computed
            if chunked:
                n = min(n, budget)
            # Whole prompts only: one that does not fit beside a prompt admitted this step waits for the next.
            if chunked or n <= budget or not admitted:
                while self._kv.allocate(seq.seq_id, seq.num_computed + n) is None:
                    # Pinned sessions yield to live requests when nothing else would free blocks.
                    if self._running or scheduled or not self._sessions.evict_lru():
                        break
                else:
                    self._waiting.pop(i)
                    self._running.append(seq)
                    self._stats.requests.scheduled(seq.seq_id)
                    scheduled.append((seq, self._step(seq, n)))
                    budget -= n
                    admitted = True
                    computing.update(self._uncomputed_blocks(seq))
                    continue
            self._kv.free(seq.seq_id)  # drop prefix-cache references taken by admit; retry next step
            seq.num_computed = 0
            break
        return scheduled

    def _uncomputed_blocks(self, seq: _Sequence) -> list[bytes]:
        """Digests of the full blocks a prefilling sequence has still to compute (none once it decodes)."""
        if not self._kv.enable_prefix_caching or len(seq.tokens) - seq.num_computed <= 1:
            return []
        bs = self._kv.block_size
        full = len(seq.tokens) // bs
        return self._kv.hashes(seq.tokens, seq.block_hashes, full)[seq.num_computed // bs : full]

    def _blocks_in_flight(self) -> set[bytes]:
        return {h for s in self._running for h in self._uncomputed_blocks(s)}

    def _needs_block_in_flight(self, seq: _Sequence, computing: set[bytes]) -> bool:
        """Whether the first block of `seq` that the cache lacks is one a running prefill is computing."""
        k = self._kv.num_cached_blocks(seq.tokens, seq.block_hashes)
        return k < (len(seq.tokens) - 1) // self._kv.block_size and seq.block_hashes[k] in computing

    def _step(self, seq: _Sequence, n: int) -> SequenceStep:
        start = seq.num_computed
        return SequenceStep(
            seq_id=seq.seq_id,
            token_ids=seq.tokens[start : start + n],
            start_pos=start,
            block_table=self._kv.block_table(seq.seq_id),
            sample=start + n == len(seq.tokens),
            sampling=seq.request.sampling,
            history=seq.tokens,
            num_prompt_tokens=seq.num_prompt,
            num_output_tokens=len(seq.tokens) - seq.num_prompt,
        )

    def _preempt(self, seq: _Sequence) -> None:
        log.debug("preempting %s (KV pool exhausted)", seq.seq_id)
        self._kv.free(seq.seq_id)
        seq.num_computed = 0
        self._running.remove(seq)
        self._waiting.insert(0, seq)
        self._stats.preemptions += 1

    def _update(self, batch: list[tuple[_Sequence, SequenceStep]], result: StepResult) -> None:
        tokens, logprobs = result.token_ids, result.logprobs
        max_len = self._engine.info.max_model_len
        for seq, step in batch:
            seq.num_computed += len(step.token_ids)
            self._kv.commit(seq.seq_id, seq.tokens, seq.num_computed)
            if seq.finished or seq.aborted:
                continue
            if seq.seq_id in result.errors:  # its row failed in the engine: it ends alone
                self._finish(seq, "error", error=result.errors[seq.seq_id])
                continue
            if seq.seq_id not in tokens:
                continue
            token = tokens[seq.seq_id]
            seq.tokens.append(token)
            try:  # this row's own work (its grammar, its stop strings, its text): a failure ends it alone
                if seq.request.sampling.constraint is not None:
                    seq.request.sampling.constraint.accept(token)
                text = seq.processor.add_token(token, max_total_reached=len(seq.tokens) >= max_len)
            except Exception as exc:
                log.exception("output processing failed for %s", seq.seq_id)
                self._finish(seq, "error", error=f"processing this request's output failed ({type(exc).__name__}); "
                                                 "see the server log")
                continue
            reason = seq.processor.finish_reason
            lp = logprobs.get(seq.seq_id)
            out = GenerationOutput(
                request_id=seq.seq_id,
                new_token_ids=[token],
                text=text,
                finished=reason is not None,
                finish_reason=reason,
                prompt_tokens=seq.num_prompt,
                completion_tokens=seq.processor.num_tokens,
                cached_prompt_tokens=seq.cached_tokens,
                logprobs=[lp] if lp else None,
            )
            self._outbox.append((seq.queue, out))
            if reason is not None:
                self._release(seq)

    def _finish(self, seq: _Sequence, reason: str, error: str | None = None) -> None:
        if not seq.finished:
            self._outbox.append((seq.queue, GenerationOutput(
                request_id=seq.seq_id,
                new_token_ids=[],
                text="",
                finished=True,
                finish_reason=reason,
                prompt_tokens=seq.num_prompt,
                completion_tokens=seq.processor.num_tokens,
                error=error,
            )))
        self._release(seq)

    def _flush(self) -> None:
        """Hand the outputs gathered since the last flush to their streams, in order."""
        for queue, out in self._outbox:
            queue.put_nowait(out)
        self._outbox.clear()

    def _release(self, seq: _Sequence) -> None:
        seq.finished = True
        if seq.request.session_id and not seq.aborted:
            self._sessions.pin(seq.request.session_id, self._kv.cached_blocks(seq.seq_id, seq.tokens))
        self._kv.free(seq.seq_id)
        if seq in self._running:
            self._running.remove(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        self._by_id.pop(seq.seq_id, None)
        self._engine.release(seq.seq_id)
