"""Continuous batching for step engines, at iteration level (vLLM V1's scheduling model), as a synchronous policy.

Every step: running sequences get their next tokens first (one for a decode, a chunk for an unfinished prefill),
then waiting sequences are admitted in (priority, arrival) order while the token budget, the sequence cap and
the KV pool allow. When the pool runs dry, the most recently admitted running sequence is preempted: its blocks
are freed and it is recomputed later from its prompt plus what it already generated. Requests are never failed
for lack of KV space and the scheduler never waits on itself.

Lower priorities yield (a chat beside a Batch API batch): in a step that admits or prefills a request, running
sequences of lower priority sit the step out (decode rows too) and waiting ones of lower priority are not admitted, so
the higher request's prefill step is as short as without them; if it cannot be scheduled after all (no KV room) they
go on. For `scheduler.priority_grace_seconds` after a request finishes, lower priorities sit out as well, and the
engine idles rather than run only them: the client of a finished request often sends its next one at once (the next
turn, an agent's next call), and it would otherwise wait for a step full of lower-priority rows. A starving request
(aging) never yields.

Shared prefixes: a request whose next uncached block a running prefill is computing (many chats with one system
prompt, n>1 choices) is a *follower*: it waits for that prefill, then reuses the block. Where the engine writes every
prefill row's keys and values before any prefill row attends (`EngineInfo.prefill_reads_step_writes`), followers are
admitted in the step that completes their prefix: they take the blocks its prefill chunks write (the leader's last
chunk, or a leader admitted whole) and their tails ride beside it as prefill rows (a one-token tail would be a decode
row, which attends before the prefill rows write: it waits a step). Otherwise they are admitted in the step after the
commit. Followers go shortest uncached remainder first among equal priority, each remainder whole (one that fits a
step is never split to fill the current step's leftover budget: its first token would come a step later all the
same, and the step that carries the others' first tokens would carry its partial work too).

With speculative decoding on (the config's `pytorch.speculative`), a decoding sequence's step may carry proposed tokens
after its last one (speculation.py decides when, ngram_draft.py what); the engine verifies them in the same step,
and `update` appends the accepted ones and the engine's token after them, gives back the KV blocks that held only
rejected ones, and stops exactly where one-token steps would have (EOS, stop strings, max_tokens).

A request under a LoRA adapter (`GenerationRequest.adapter`) carries its adapter's id on every step it is in, and its
KV blocks are keyed by it (prefix_cache.root_hash): it shares blocks only with requests under the same adapter load.

`StepScheduler` holds no engine, thread or event loop: `schedule()` plans a step, the caller runs it on the engine,
`update()` turns the engine's result into outputs. Tests drive it by hand, without a model or a loop (as vLLM's
`Scheduler` is tested); `continuous_batcher.py` drives it on a real engine.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field

from engines.interface import Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, SequenceStep, StepResult
from gateway.kv_cache import prefix_cache
from gateway.kv_cache.manager import KVCacheManager
from gateway.kv_cache.sessions import SessionStore
from gateway.repository.engine_config import SpeculativeSection
from gateway.repository.model_config import KVCacheConfig, SchedulerConfig
from gateway.scheduler.llm.interface import SchedulerStats, admission_key
from gateway.scheduler.llm.ngram_draft import NgramIndex
from gateway.scheduler.llm.output_processor import OutputProcessor
from gateway.scheduler.llm.queue_policy import REJECTED, QueuePolicy, retry_after_seconds
from gateway.scheduler.llm.speculation import SequenceSpeculation, verifiable

log = logging.getLogger("switchyard.scheduler")

# full blocks a step being planned completes, by digest: the block, and its tokens (checked as a cache hit is)
Written = dict[bytes, tuple[int, tuple[int, ...]]]


@dataclass
class _Sequence:
    request: GenerationRequest
    processor: OutputProcessor
    order: int
    tokens: list[int] = field(default_factory=list)  # prompt + output
    num_computed: int = 0  # tokens already in the KV cache
    aborted: bool = False
    finished: bool = False
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    block_hashes: list[bytes] = field(default_factory=list)  # digests of its full blocks, computed once each
    spec: SequenceSpeculation | None = None  # its proposer, when speculative decoding may propose for it
    started: bool = False  # admitted once (a preempted sequence waits again, but is never timed out)
    root: bytes = prefix_cache.ROOT_HASH  # its KV digests' chain start: its LoRA adapter's own (prefix_cache.py)
    follower: bool = False  # has waited for a prefix block another sequence's prefill was computing

    @property
    def seq_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt_token_ids)

    def sort_key(self, now: float, aging_seconds: float) -> tuple[float, int]:
        return admission_key(self.request, self.order, now, aging_seconds)


@dataclass
class StepPlan:
    """One planned step: the engine's work, and the outputs of sequences that ended while it was planned (aborts)."""

    scheduled: list[tuple[_Sequence, SequenceStep]] = field(default_factory=list)
    finished: list[GenerationOutput] = field(default_factory=list)
    # with nothing scheduled: how long the driver may idle before planning again unless a request arrives (lower
    # priorities held back for an expected arrival); 0: try again shortly
    idle_seconds: float = 0.0

    @property
    def steps(self) -> list[SequenceStep]:
        """What `engine.execute` computes, one entry per sequence."""
        return [step for _, step in self.scheduled]


class StepScheduler:
    """The continuous-batching policy: which tokens of which sequences the next step computes, and what its result
    means for each request. Synchronous and single-threaded; it never calls the engine.

    Every request ends with exactly one output whose `finished` is true (stop, length, abort or error); after it the
    engine may drop the sequence's state."""

    def __init__(
        self,
        info: EngineInfo,
        tokenizer: Tokenizer,
        scheduler: SchedulerConfig | None = None,
        kv_cache: KVCacheConfig | None = None,
        speculative: SpeculativeSection | None = None,
    ) -> None:
        """The model config's validated sections: `scheduler` (budgets, queue), `kv_cache` (prefix caching,
        sessions; the pool itself is the engine's) and `pytorch.speculative` (None: off)."""
        self._info = info
        self._tokenizer = tokenizer
        self._limits = scheduler or SchedulerConfig()
        self._queue = QueuePolicy(self._limits)
        kv = kv_cache or KVCacheConfig()
        self._kv = KVCacheManager(info.num_kv_blocks, info.block_size, kv.enable_prefix_caching)
        max_session_tokens = kv.session_max_tokens or info.num_kv_blocks * info.block_size // 4
        self._sessions = SessionStore(
            self._kv.pool, kv.session_ttl_seconds, max(0, max_session_tokens // info.block_size)
        )
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._order = itertools.count()
        self._admissions = 0  # moves from waiting to running, preempted sequences' returns included
        self._stats = SchedulerStats(kv_blocks_total=info.num_kv_blocks)
        self._spec = speculative if info.exact_verification else None
        if speculative is not None and self._spec is None:
            log.warning(
                "speculative decoding is off: this engine's verification steps would not compute what "
                "one-token steps compute (the native engine needs its C kernels: pytorch.fast_kernels)"
            )
        self._outputs: list[GenerationOutput] = []  # gathered by the call in progress, handed back when it returns
        self._finished_at: dict[int, float] = {}  # priority -> when a request of it last finished (grace window)
        self._idle_until = 0.0  # set by _schedule when lower priorities are held back and nothing else runs

    def stats(self) -> SchedulerStats:
        self._stats.running = len(self._running)
        self._stats.waiting = len(self._waiting)
        self._stats.kv_blocks_used = self._kv.pool.num_used
        self._stats.prefix_cache_queried_tokens = self._kv.prefix_stats.queried_tokens
        self._stats.prefix_cache_hit_tokens = self._kv.prefix_stats.hit_tokens
        self._stats.sessions = len(self._sessions)
        self._stats.session_pinned_blocks = self._sessions.pinned_blocks
        self._stats.rejected = self._queue.rejected
        self._stats.expected_wait_seconds = self._queue.expected_wait(len(self._waiting)) or 0.0
        return self._stats

    def retry_after(self) -> int:
        """Retry-After (seconds) for a request refused now: how long the queue is expected to take to drain."""
        return retry_after_seconds(self._queue.expected_wait(len(self._waiting)))

    def delete_session(self, session_id: str) -> bool:
        return self._sessions.release(session_id)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running (aborted ones included until the next `schedule`)."""
        return bool(self._running or self._waiting)

    # -- requests in and out ------------------------------------------------------------------------------------
    def add(self, request: GenerationRequest) -> None:
        """Queue a request; raises OverloadedError (429) when the queue policy refuses it (queue_policy.py) and
        ValueError on a duplicate id."""
        self._queue.admit(request, (s.request for s in self._waiting))
        if request.request_id in self._by_id:
            raise ValueError(f"duplicate request id {request.request_id}")
        info = self._info
        processor = OutputProcessor(self._tokenizer, request.prompt_token_ids, request.sampling, info.eos_token_ids)
        seq = _Sequence(request, processor, next(self._order), list(request.prompt_token_ids))
        adapter_id = request.adapter.id if request.adapter is not None else 0
        seq.root = prefix_cache.root_hash(adapter_id)
        spec = self._spec
        # no proposals under a LoRA adapter: its updates are torch ops, whose bits may depend on a call's rows
        if spec is not None and verifiable(request.sampling) and not adapter_id:
            seq.spec = SequenceSpeculation(NgramIndex(spec.prompt_lookup_min, spec.prompt_lookup_max))
        if not request.arrival_time:
            request.arrival_time = time.monotonic()
        self._waiting.append(seq)
        self._by_id[seq.seq_id] = seq

    def abort(self, request_id: str) -> None:
        """Mark a request aborted (its client went away). Safe while a step is in flight: it produces nothing more
        and its blocks are freed by the next `schedule`. Unknown or finished ids are ignored."""
        seq = self._by_id.get(request_id)
        if seq is not None and not seq.finished:
            seq.aborted = True

    def finish_all(self, reason: str, error: str | None = None) -> list[GenerationOutput]:
        """End every waiting and running request (the model is unloaded, or scheduling itself failed)."""
        for seq in [*self._running, *self._waiting]:
            self._finish(seq, reason, error=error)
        return self._take_outputs()

    # -- one step -----------------------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Reap aborted requests, refuse or delay those past their queue timeout, expire idle sessions, and plan
        the next step. An empty `steps` with `has_unfinished()` means nothing fits right now (blocks held by
        sequences being aborted): try again shortly. A request refused while waiting ends with finish_reason
        REJECTED (queue_policy.py) and its error message."""
        self._reap_aborted()
        self._expire_waiting()
        self._sessions.expire()
        admitted = self._admissions
        self._idle_until = 0.0
        scheduled = self._schedule() if self.has_unfinished() else []
        now = time.monotonic()
        self._queue.rate.update(now, len(self._waiting), self._admissions - admitted)
        return StepPlan(scheduled, self._take_outputs(), max(0.0, self._idle_until - now))

    def update(self, plan: StepPlan, result: StepResult) -> list[GenerationOutput]:
        """Apply the engine's result for `plan`: commit the computed tokens, append the sampled ones, and return each
        request's new output. A row that failed (in the engine, or in its own grammar or detokenization) ends alone."""
        self._stats.steps += 1
        self._update(plan.scheduled, result)
        return self._take_outputs()

    def fail(self, plan: StepPlan, error: str) -> list[GenerationOutput]:
        """The engine raised on `plan`: end the requests in that step, and only those."""
        for seq, _ in plan.scheduled:
            self._finish(seq, "error", error=error)
        return self._take_outputs()

    def _take_outputs(self) -> list[GenerationOutput]:
        out, self._outputs = self._outputs, []
        return out

    def _reap_aborted(self) -> None:
        for seq in [s for s in (*self._running, *self._waiting) if s.aborted]:
            self._finish(seq, "abort")

    def _expire_waiting(self) -> None:
        now = time.monotonic()
        for seq in [s for s in self._waiting if not s.started and self._queue.expired(s.request, now)]:
            error = self._queue.on_expired(seq.request, len(self._waiting))
            if error is not None:
                seq.aborted = True  # never ran: its session (if any) pins nothing
                self._finish(seq, REJECTED, error=error.message)

    def _schedule(self) -> list[tuple[_Sequence, SequenceStep]]:
        budget = self._limits.max_num_batched_tokens
        scheduled: list[tuple[_Sequence, SequenceStep]] = []
        now = time.monotonic()
        aging = self._limits.aging_seconds
        running = sorted(self._running, key=lambda s: s.sort_key(now, aging))
        # Lower priorities yield (module docstring): to the best priority that waits and could be admitted, that
        # prefills, or that finished within the grace window (`anticipated`); a starving request counts as the highest.
        lead, anticipated = self._lead_priority(now, aging)
        deferred = [s for s in running if lead is not None and s.sort_key(now, aging)[0] > lead]
        active = [s for s in running if s not in deferred]
        spec = self._spec
        speculate = spec is not None and len(active) <= spec.disable_by_batch_size
        # proposals stay within the decode rows whose logits the engine computes as one-token steps do (the running
        # sequences that take this step here; admissions that are decode rows shorten them after: _fit_drafts)
        limit = self._info.max_exact_decode_rows
        spare_rows = limit - len(active) if limit else budget
        served = False  # whether the step admits or prefills a sequence the others yield to
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            if seq in deferred:
                i += 1
                continue
            n = min(len(seq.tokens) - seq.num_computed, budget)
            drafts = self._propose(seq, min(budget - n, spare_rows)) if speculate and n == 1 else []
            spare_rows -= len(drafts)
            if drafts and not self._kv.can_allocate(seq.seq_id, seq.num_computed + n + len(drafts)):
                drafts = []  # proposals never take blocks another sequence needs
            while self._kv.allocate(seq.seq_id, seq.num_computed + n + len(drafts)) is None:
                victim = running.pop()  # lowest priority, latest arrival
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                scheduled.append((seq, self._step(seq, n, drafts)))
                budget -= n + len(drafts)
                served = served or n > 1
                i += 1
                continue
            break
        # Full blocks this step's prefill rows complete (digest -> block and its tokens): where the engine lets a
        # prefill row read what another writes in the same step, a follower takes them and rides along.
        written: Written = {}
        if self._info.prefill_reads_step_writes:
            for seq, planned in scheduled:
                self._note_writes(seq, planned, written)
        # Requests whose next uncached block is being prefilled right now (n>1 choices, one system prompt for many
        # chats) find it in the cache instead of computing it again: in the step that completes it (its blocks
        # taken from the writer, their tails as prefill rows beside its chunk) where the engine allows, else in the
        # step after the commit; as the budget allows.
        computing = self._blocks_in_flight()
        self._waiting.sort(key=lambda s: self._queue.sort_key(s.request, s.order, now))
        self._order_followers(now, computing, written)
        chunked, admitted = self._limits.enable_chunked_prefill, False
        i = 0
        while (
            i < len(self._waiting)
            and (budget > 0 or not (chunked or admitted))
            and len(self._running) < self._limits.max_num_seqs
        ):
            seq = self._waiting[i]
            if lead is not None and seq.sort_key(now, aging)[0] > lead:
                i += 1
                continue
            riding: list[int] = []
            if seq.num_computed == 0:
                if computing and self._needs_block_in_flight(seq, computing):
                    seq.follower = True
                    riding = self._ride(seq, written, computing)
                    if not riding:
                        i += 1
                        continue
                seq.num_computed = self._kv.admit(seq.seq_id, seq.tokens, seq.block_hashes, seq.root)
                if riding:
                    seq.num_computed += self._kv.share(seq.seq_id, riding)
                if seq.request.session_id:
                    self._sessions.touch(seq.request.session_id)
                if not seq.processor.num_tokens:
                    seq.cached_tokens = seq.num_computed
            n = len(seq.tokens) - seq.num_computed
            whole = n <= self._limits.max_num_batched_tokens
            # a rider's rows must be prefill rows (a one-token step is a decode row, which attends before the
            # step's prefill rows write); its remainder, too, whole when it fits a step
            if riding and (min(n, budget) < 2 or (budget < n and (whole or not chunked))):
                self._kv.free(seq.seq_id)  # it takes the blocks from the cache in the next step
                seq.num_computed = 0
                i += 1
                continue
            if chunked and seq.follower and admitted and budget < n and whole:
                self._kv.free(seq.seq_id)  # a follower's remainder is not split: whole in the next step
                seq.num_computed = 0
                i += 1
                continue
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
                    seq.started, seq.follower = True, False
                    self._admissions += 1
                    self._queue.forget(seq.seq_id)
                    scheduled.append((seq, self._step(seq, n)))
                    budget -= n
                    admitted = served = True
                    computing.update(self._uncomputed_blocks(seq))
                    if self._info.prefill_reads_step_writes:
                        self._note_writes(seq, scheduled[-1][1], written)
                    continue
            self._kv.free(seq.seq_id)  # drop prefix-cache references taken by admit; retry next step
            seq.num_computed = 0
            break
        if anticipated and not scheduled:  # only lower priorities left: idle a moment for the expected arrival
            self._idle_until = anticipated
        elif not served and not anticipated:  # nobody they yield to could be scheduled (no KV room): they go on
            for seq in deferred:
                n = min(len(seq.tokens) - seq.num_computed, budget)
                if n > 0 and seq in self._running and self._kv.allocate(seq.seq_id, seq.num_computed + n) is not None:
                    scheduled.append((seq, self._step(seq, n)))
                    budget -= n
        if limit:
            self._fit_drafts(scheduled, limit)
        return scheduled

    def _lead_priority(self, now: float, aging: float) -> tuple[float | None, float]:
        """The priority lower ones yield to this step (None: no one yields), and the end of the grace window that
        holds them back when one does (0: none; they yield only to a request this step admits or prefills)."""
        keys = [s.sort_key(now, aging)[0] for s in self._running if len(s.tokens) - s.num_computed > 1]
        if self._waiting and len(self._running) < self._limits.max_num_seqs:
            keys.append(min(s.sort_key(now, aging)[0] for s in self._waiting))
        grace = self._limits.priority_grace_seconds
        for priority, at in list(self._finished_at.items()):
            if now - at >= grace:
                del self._finished_at[priority]
        recent = min(self._finished_at, default=None)
        if recent is not None and (not keys or recent < min(keys)):
            return recent, self._finished_at[recent] + grace
        return (min(keys) if keys else None), 0.0

    def _order_followers(self, now: float, computing: set[bytes], written: Written) -> None:
        """Among waiting followers of equal admission priority, shortest uncached remainder first (in the queue
        positions those followers hold, so nobody else moves): once a shared prefix is complete (in the cache, or
        `written` by this step), the step's first tokens go to as many followers as its budget holds, and the p90
        time to first token is lowest. A request is a follower from the first step it finds a block it needs in
        flight (`computing`), so riders are ordered already in the step that completes their prefix."""
        if written:  # as far as a step could admit (the loop below finds the others when it reaches them)
            for seq in self._waiting[: self._limits.max_num_seqs]:
                if not seq.follower and seq.num_computed == 0 and self._needs_block_in_flight(seq, computing):
                    seq.follower = True
        slots = [i for i, s in enumerate(self._waiting) if s.follower and s.num_computed == 0]
        if len(slots) < 2:
            return
        bs = self._kv.block_size

        def key(seq: _Sequence) -> tuple[bool, float, int, int]:
            delayed, priority, _ = self._queue.sort_key(seq.request, seq.order, now)
            k = self._kv.num_cached_blocks(seq.tokens, seq.block_hashes, seq.root)
            cached = (k + len(self._written_run(seq, k, written))) * bs
            return delayed, priority, len(seq.tokens) - cached, seq.order

        followers = sorted((self._waiting[i] for i in slots), key=key)
        for i, seq in zip(slots, followers, strict=True):
            self._waiting[i] = seq

    def _note_writes(self, seq: _Sequence, step: SequenceStep, written: Written) -> None:
        """Add to `written` the full blocks that `step`, if it is a prefill row (two or more new tokens, no
        proposals), completes: a block partly computed by an earlier chunk is complete once this step has written
        the rest of it; blocks completed before are committed, in the cache already."""
        if not self._kv.enable_prefix_caching or len(step.token_ids) < 2 or step.num_draft_tokens:
            return
        bs = self._kv.block_size
        end = (step.start_pos + len(step.token_ids)) // bs
        hashes = self._kv.hashes(seq.tokens, seq.block_hashes, end, seq.root)
        for i in range(step.start_pos // bs, end):
            written.setdefault(hashes[i], (step.block_table[i], tuple(seq.tokens[i * bs : (i + 1) * bs])))

    def _written_run(self, seq: _Sequence, k: int, written: Written) -> list[int]:
        """The blocks of `written` that hold `seq`'s prompt blocks k, k + 1, ... (k: its first block not in the
        cache), as far as they go, each checked against its own tokens; at least one token is left to compute."""
        bs, blocks = self._kv.block_size, []
        last = (len(seq.tokens) - 1) // bs
        self._kv.hashes(seq.tokens, seq.block_hashes, last, seq.root)
        while (
            k < last
            and (hit := written.get(seq.block_hashes[k]))
            and hit[1] == tuple(seq.tokens[k * bs : (k + 1) * bs])
        ):
            blocks.append(hit[0])
            k += 1
        return blocks

    def _ride(self, seq: _Sequence, written: Written, computing: set[bytes]) -> list[int]:
        """The blocks a waiting follower takes to be admitted in this step: the shared blocks this step completes,
        when its prefix is then complete (none of its later blocks still in flight for a later chunk); else none."""
        if not written:
            return []
        k = self._kv.num_cached_blocks(seq.tokens, seq.block_hashes, seq.root)
        blocks = self._written_run(seq, k, written)
        j = k + len(blocks)
        if blocks and j < (len(seq.tokens) - 1) // self._kv.block_size and seq.block_hashes[j] in computing:
            return []
        return blocks

    def _fit_drafts(self, scheduled: list[tuple[_Sequence, SequenceStep]], limit: int) -> None:
        """Shorten proposals, latest-scheduled first, until the step's decode rows fit `limit`. An admission whose
        uncached remainder is one token (a prefix-cache hit, a preempted sequence back) is a decode row too, known only
        once admitted; admissions come before proposals, which only save steps."""
        rows = sum(len(step.token_ids) for _, step in scheduled if len(step.token_ids) == 1 + step.num_draft_tokens)
        excess = rows - limit
        for k in range(len(scheduled) - 1, -1, -1):
            seq, step = scheduled[k]
            if excess <= 0:
                return
            if not step.num_draft_tokens:
                continue
            keep = max(0, step.num_draft_tokens - excess)
            excess -= step.num_draft_tokens - keep
            self._kv.truncate(seq.seq_id, seq.num_computed + 1 + keep)  # the blocks only cut proposals needed
            scheduled[k] = (seq, self._step(seq, 1, step.draft_token_ids[:keep]))

    def _uncomputed_blocks(self, seq: _Sequence) -> list[bytes]:
        """Digests of the full blocks a prefilling sequence has still to compute (none once it decodes)."""
        if not self._kv.enable_prefix_caching or len(seq.tokens) - seq.num_computed <= 1:
            return []
        bs = self._kv.block_size
        full = len(seq.tokens) // bs
        return self._kv.hashes(seq.tokens, seq.block_hashes, full, seq.root)[seq.num_computed // bs : full]

    def _blocks_in_flight(self) -> set[bytes]:
        return {h for s in self._running for h in self._uncomputed_blocks(s)}

    def _needs_block_in_flight(self, seq: _Sequence, computing: set[bytes]) -> bool:
        """Whether the first block of `seq` that the cache lacks is one a running prefill is computing."""
        k = self._kv.num_cached_blocks(seq.tokens, seq.block_hashes, seq.root)
        return k < (len(seq.tokens) - 1) // self._kv.block_size and seq.block_hashes[k] in computing

    def _propose(self, seq: _Sequence, budget: int) -> list[int]:
        """Tokens to verify after a decoding sequence's last one: none past its max_tokens or the context length
        (the token verification emits after them is its own), nor past the step's token budget."""
        spec = self._spec
        if seq.spec is None or spec is None:
            return []
        room = min(
            spec.num_speculative_tokens,
            budget,
            seq.request.sampling.max_tokens - seq.processor.num_tokens - 1,
            self._info.max_model_len - len(seq.tokens) - 1,
        )
        return seq.spec.propose(seq.tokens, seq.processor.num_tokens, room)

    def _step(self, seq: _Sequence, n: int, drafts: list[int] | None = None) -> SequenceStep:
        start = seq.num_computed
        return SequenceStep(
            seq_id=seq.seq_id,
            token_ids=seq.tokens[start : start + n] + (drafts or []),
            start_pos=start,
            block_table=self._kv.block_table(seq.seq_id),
            sample=start + n == len(seq.tokens),
            sampling=seq.request.sampling,
            history=seq.tokens,
            num_prompt_tokens=seq.num_prompt,
            num_output_tokens=len(seq.tokens) - seq.num_prompt,
            num_draft_tokens=len(drafts or []),
            adapter_id=seq.request.adapter.id if seq.request.adapter is not None else 0,
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
        max_len = self._info.max_model_len
        for seq, step in batch:
            drafts = step.draft_token_ids[: result.num_accepted.get(seq.seq_id, 0)] if seq.seq_id in tokens else []
            seq.num_computed += len(step.token_ids) - step.num_draft_tokens + len(drafts)
            seq.tokens.extend(drafts)  # accepted: computed, their keys and values are right
            self._kv.commit(seq.seq_id, seq.tokens, seq.num_computed)
            if step.num_draft_tokens:
                self._verified(seq, step, len(drafts))
            if seq.finished or seq.aborted:
                continue
            if seq.seq_id in result.errors:  # its row failed in the engine: it ends alone
                self._finish(seq, "error", error=result.errors[seq.seq_id])
                continue
            if seq.seq_id not in tokens:
                continue
            seq.tokens.append(tokens[seq.seq_id])
            before = len(seq.tokens) - len(drafts) - 1  # the sequence's length before this step's tokens
            emitted: list[int] = []
            text = ""
            try:  # this row's own work (its grammar, its stop strings, its text): a failure ends it alone
                for token in seq.tokens[before:]:  # exactly what one-token steps would do, token after token
                    if seq.request.sampling.constraint is not None:
                        seq.request.sampling.constraint.accept(token)
                    emitted.append(token)
                    text += seq.processor.add_token(token, max_total_reached=before + len(emitted) >= max_len)
                    if seq.processor.finish_reason is not None:
                        break
            except Exception as exc:
                log.exception("output processing failed for %s", seq.seq_id)
                self._finish(
                    seq,
                    "error",
                    error=f"processing this request's output failed ({type(exc).__name__}); see the server log",
                )
                continue
            reason = seq.processor.finish_reason
            lp = logprobs.get(seq.seq_id)
            out = GenerationOutput(
                request_id=seq.seq_id,
                new_token_ids=emitted,
                text=text,
                finished=reason is not None,
                finish_reason=reason,
                prompt_tokens=seq.num_prompt,
                completion_tokens=seq.processor.num_tokens,
                cached_prompt_tokens=seq.cached_tokens,
                logprobs=[lp] if lp else None,
            )
            self._outputs.append(out)
            if reason is not None:
                if self._limits.priority_grace_seconds > 0:
                    self._finished_at[seq.request.priority] = time.monotonic()
                self._release(seq)

    def _verified(self, seq: _Sequence, step: SequenceStep, accepted: int) -> None:
        """After a verification: free the blocks that hold only rejected tokens, and count the acceptance."""
        self._kv.truncate(seq.seq_id, seq.num_computed + 1)
        self._stats.spec_drafts += 1
        self._stats.spec_draft_tokens += step.num_draft_tokens
        self._stats.spec_accepted_tokens += accepted
        spec = self._spec
        if seq.spec is not None and spec is not None:
            seq.spec.record(step.num_draft_tokens, accepted, seq.processor.num_tokens + accepted, spec.min_acceptance)

    def _finish(self, seq: _Sequence, reason: str, error: str | None = None) -> None:
        if not seq.finished:
            self._outputs.append(
                GenerationOutput(
                    request_id=seq.seq_id,
                    new_token_ids=[],
                    text="",
                    finished=True,
                    finish_reason=reason,
                    prompt_tokens=seq.num_prompt,
                    completion_tokens=seq.processor.num_tokens,
                    error=error,
                )
            )
        self._release(seq)

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
        self._queue.forget(seq.seq_id)
