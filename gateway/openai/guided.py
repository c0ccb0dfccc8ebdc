"""Guided decoding: JSON schemas and grammars compiled with llguidance, applied as `TokenConstraint`s.

The engine's sampler asks each sequence's constraint for the allowed-token mask right before sampling and the
scheduler reports each sampled token back, so `response_format` and forced tool calls can only produce text the
grammar accepts; once the grammar is complete only end-of-sequence tokens are allowed.

Why llguidance rather than xgrammar: measured side by side in one process (`bench/guided_mask.py`) with the
SmolLM2 tokenizer (vocabulary 49152), walking 10 documents (704 tokens) through a nested schema with objects, enums,
arrays and required fields, and through json_object; mask time includes making the bool tensor the sampler wants:

                          quiet machine                          busy machine (load ~5 on 2 cores)
    xgrammar 0.2.9        compile 10-13 ms, mask ~100 us,        compile 13-38 ms, mask p50 ~120 us,
                          p99 ~200 us                            p99 36-99 ms
    llguidance 1.9.1      compile ~1 ms, mask ~85 us,            compile 3-6 ms (with our schema checks),
                          p99 ~200 us                            mask p50 ~90 us, p99 0.4-0.8 ms

Typical per-token masks cost the same (well under 1% of a model step), but llguidance compiles 5-10x faster, which
matters because tool and `response_format` schemas change per request, and its worst-case mask stays under a
millisecond on a loaded CPU where xgrammar's reaches tens of milliseconds (a stalled step for the whole batch).
It was built for untrusted grammars (fuel limits bound the work per token), and it installs as one 3 MB wheel with
no dependencies, whereas xgrammar pulls in `triton` (a GPU compiler) and `apache-tvm-ffi`.

Compiles run on a small dedicated thread pool with a deadline, never on the event loop; compiled grammars are kept
in a bounded LRU cache per model, and each sequence gets a cheap deep copy of the cached matcher.

A request's constraint is first described as an engine-agnostic `GuidedSpec` (engines/types.py); it is compiled
here only for engines that apply masks. Engines that enforce specs themselves (vLLM's structured outputs, remote
upstreams; `AsyncGenerateEngine.enforces_guided_spec`) get the spec alone, so llguidance is imported lazily: a
vLLM-backed model never loads it here (vLLM brings its own).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engines.interface import Tokenizer
from engines.token_constraint import TokenConstraint
from engines.types import JSON_FORMAT, GuidedSpec
from gateway.errors import InvalidRequestError

if TYPE_CHECKING:
    import llguidance

log = logging.getLogger("switchyard.guided")

MAX_SCHEMA_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 64  # JSON nesting levels; llguidance's own parser stops at 128
# An object with N properties puts ~4N items in one row of llguidance's Earley parser. Its default row limit (2000)
# let a 1000-property schema compile and then fail on the object's first token, mid-answer; with 20000 such rows
# cost at most ~30 ms per mask step here, and objects are capped so that every accepted schema stays inside it.
MAX_ITEMS_IN_ROW = 20_000
MAX_OBJECT_PROPERTIES = 2_000
COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256

# Output is compact and deterministic: no free whitespace (a small model could emit newlines forever), the same
# separators as Python's json.dumps. oneOf is treated as anyOf (pydantic emits oneOf for tagged unions).
JSON_OPTIONS: dict[str, Any] = JSON_FORMAT

_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-compile")


def _llg() -> Any:
    import llguidance  # deferred: only models whose engine applies our masks compile grammars

    return llguidance


def _shape(value: Any) -> tuple[int, int]:
    """Nesting depth of JSON data and the most `properties` any object in it lists, without recursion (a 10k-deep
    schema must not blow the stack here)."""
    deepest, widest, stack = 0, 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_SCHEMA_DEPTH:
            return level, widest
        if isinstance(node, dict) and isinstance(node.get("properties"), dict):
            widest = max(widest, len(node["properties"]))
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest, widest


@functools.lru_cache(maxsize=1024)
def _meta_schema_error(text: str) -> str | None:
    """Why `text` is not a valid JSON Schema, or None. Cached: the check is pure Python, milliseconds per schema,
    and the same tool and response schemas come back request after request."""
    import jsonschema  # deferred: only requests with schemas pay for the import

    schema = json.loads(text)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.path)
        return f"{f' at /{path}' if path else ''}: {exc.message[:200]}"
    return None


def check_json_schema(schema: Any, param: str, where: str = "schema") -> str:
    """Refuse schemas that are too big, too deep or not JSON Schema; return the schema serialized."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{where} must be a JSON Schema object", param=param)
    depth, widest = _shape(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidRequestError(f"{where} is nested more than {MAX_SCHEMA_DEPTH} levels deep", param=param)
    if widest > MAX_OBJECT_PROPERTIES:
        raise InvalidRequestError(f"{where} has an object with more than {MAX_OBJECT_PROPERTIES} properties",
                                  param=param)
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_SCHEMA_BYTES:
        raise InvalidRequestError(f"{where} is larger than {MAX_SCHEMA_BYTES // 1024} KiB", param=param)
    error = _meta_schema_error(text)
    if error is not None:
        raise InvalidRequestError(f"{where} is not a valid JSON Schema{error}", param=param)
    return text


def close_objects(schema: Any) -> Any:
    """A copy where objects that list `properties` but say nothing of `additionalProperties` forbid others.

    Without this a model may invent keys forever; vLLM (xgrammar's strict mode, and its llguidance backend) does
    the same by default. Schemas that set `additionalProperties` keep their choice.
    """
    if isinstance(schema, list):
        return [close_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: close_objects(value) for key, value in schema.items()}
    if "additionalProperties" not in out and ("properties" in out or "patternProperties" in out):
        out["additionalProperties"] = False
    return out


def lark_json(schema: dict[str, Any]) -> str:
    """`%json {...}` for embedding a schema in a Lark grammar, with the same options as a top-level schema."""
    return "%json " + json.dumps({"x-guidance": JSON_OPTIONS, **close_objects(schema)}, ensure_ascii=False)


def _short(error: str) -> str:
    first = error.strip().splitlines()[0][:300] if error.strip() else "unknown error"
    if first == "NoExtensionBias":
        return "no JSON value satisfies it (e.g. a $ref that only refers to itself)"
    return first


class GrammarConstraint(TokenConstraint):
    """One sequence's position in a grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: list[int]) -> None:
        self._matcher = matcher
        self._eos = eos_token_ids
        self._failed = False

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        raw = self._matcher.compute_logit_bias()  # one byte per token: 0 = banned, 200 = allowed
        # numpy for the conversion: a few microseconds, where each small torch op costs tens on a busy CPU
        mask = np.frombuffer(raw, dtype=np.uint8)[:vocab_size] != 0
        if mask.shape[0] < vocab_size:
            mask = np.concatenate([mask, np.zeros(vocab_size - mask.shape[0], dtype=bool)])
        if not mask.any():  # never leave the sampler with nothing to pick: end the sequence instead
            mask[[t for t in self._eos if t < vocab_size]] = True
        return torch.from_numpy(mask)

    def accept(self, token_id: int) -> None:
        # Called from the scheduler's loop: never raise. A rejected token (an engine that ignored the mask) puts
        # the matcher in its error state, where it allows only end-of-sequence.
        if not self._matcher.consume_token(token_id) and not self._failed:
            self._failed = True
            log.debug("guided decoding: token %d rejected (%s)", token_id, _short(self._matcher.get_error()))

    @property
    def is_accepting(self) -> bool:
        return self._matcher.is_accepting()


class CompiledGrammar:
    """A compiled grammar; `constraint()` makes a fresh per-sequence copy."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: list[int]) -> None:
        self._matcher = matcher
        self._eos = eos_token_ids

    def constraint(self) -> GrammarConstraint:
        return GrammarConstraint(self._matcher.deep_copy(), self._eos)


class GuidedDecoder:
    """Compiles grammars for one model's tokenizer and caches them (LRU, bounded)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int], cache_size: int = CACHE_SIZE):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()

    def _llg_tokenizer(self) -> Any:
        with self._lock:  # building it walks the vocabulary (~1 s): once per model, on the compile pool
            if self._ll_tokenizer is None:
                import llguidance.hf

                hf = getattr(self._tokenizer, "hf", None)
                if not hasattr(hf, "backend_tokenizer"):
                    raise InvalidRequestError("guided decoding needs a fast Hugging Face tokenizer")
                n_vocab = max(self._vocab_size, len(hf))
                self._ll_tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=n_vocab, eos_token=self._eos or None)
            return self._ll_tokenizer

    def _compile(self, grammar: str, param: str) -> CompiledGrammar:
        llg = _llg()
        limits = llg.LLParserLimits(max_items_in_row=MAX_ITEMS_IN_ROW)
        matcher = llg.LLMatcher(self._llg_tokenizer(), grammar, log_level=0, limits=limits)
        if not matcher.is_error():
            probe = matcher.deep_copy()  # some grammars (e.g. {"$ref": "#"}) only fail at their first mask
            probe.compute_logit_bias()
            if probe.is_error():
                matcher = probe
        if matcher.is_error():
            raise InvalidRequestError(f"the grammar cannot be used for guided decoding: {_short(matcher.get_error())}",
                                      param=param)
        return CompiledGrammar(matcher, self._eos)

    async def _get(self, key: str, grammar_fn: Any, param: str) -> CompiledGrammar:
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached

        def build() -> CompiledGrammar:
            try:
                grammar = grammar_fn()
            except ValueError as exc:  # llguidance refuses it outright (e.g. its own nesting limit)
                raise InvalidRequestError(f"the grammar cannot be used for guided decoding: {_short(str(exc))}",
                                          param=param) from None
            return self._compile(grammar, param)

        loop = asyncio.get_running_loop()
        try:
            compiled = await asyncio.wait_for(loop.run_in_executor(_EXECUTOR, build), COMPILE_TIMEOUT_S)
        except TimeoutError:
            raise InvalidRequestError(
                f"the grammar took longer than {COMPILE_TIMEOUT_S:.0f} s to compile; simplify it", param=param
            ) from None
        self._cache[key] = compiled
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return compiled

    async def json_schema(self, schema: dict[str, Any], param: str, where: str = "schema") -> CompiledGrammar:
        """Compile a JSON Schema (checked first: size, depth, meta-schema)."""
        text = check_json_schema(schema, param, where)
        return await self._json(schema, "json:" + text, param)

    async def _json(self, schema: dict[str, Any], key: str, param: str) -> CompiledGrammar:
        def grammar() -> str:
            return _llg().LLMatcher.grammar_from_json_schema(close_objects(schema), defaults=JSON_OPTIONS)

        return await self._get(key, grammar, param)

    async def lark(self, source: str, param: str) -> CompiledGrammar:
        """Compile a Lark grammar (llguidance's dialect; `%json {...}` embeds a JSON Schema)."""
        return await self._get("lark:" + source, lambda: _llg().LLMatcher.grammar_from_lark(source), param)

    async def regex(self, pattern: str, param: str) -> CompiledGrammar:
        """Compile a regular expression (Rust `regex` syntax); the whole output must match it."""
        return await self._get("regex:" + pattern, lambda: _llg().LLMatcher.grammar_from_regex(pattern), param)

    async def compile(self, spec: GuidedSpec, param: str) -> CompiledGrammar:
        """Compile a spec built by `json_spec` / `request_spec` / a tool parser (schemas already checked)."""
        if spec.kind == "json":
            key = "json:" + json.dumps(spec.value, ensure_ascii=False, separators=(",", ":"))
            return await self._json(spec.value, key, param)
        if spec.kind == "regex":
            return await self.regex(spec.value, param)
        if spec.kind == "choice":
            return await self.lark(choice_grammar(spec.value), param)
        return await self.lark(spec.value, param)

    def cache_len(self) -> int:
        return len(self._cache)


_DECODERS: weakref.WeakKeyDictionary[Any, GuidedDecoder] = weakref.WeakKeyDictionary()


def decoder_for(scheduler: Any) -> GuidedDecoder:
    """The model's decoder (one per scheduler, created on first use)."""
    decoder = _DECODERS.get(scheduler)
    if decoder is None:
        info = scheduler.info
        decoder = GuidedDecoder(scheduler.tokenizer, info.vocab_size, info.eos_token_ids)
        _DECODERS[scheduler] = decoder
    return decoder


def engine_enforces_specs(scheduler: Any) -> bool:
    """Whether the model's engine enforces `GuidedSpec`s itself (vLLM, remote) instead of applying our masks."""
    return getattr(getattr(scheduler, "engine", None), "enforces_guided_spec", False) is True


def choice_grammar(choices: list[str]) -> str:
    """The Lark grammar accepting exactly one of `choices`."""
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def json_spec(schema: Any, param: str, where: str = "schema") -> GuidedSpec:
    """A checked JSON Schema as a spec, its objects closed (what every engine then enforces as given)."""
    check_json_schema(schema, param, where)
    return GuidedSpec("json", close_objects(schema), param)


@dataclass
class Guidance:
    """A request's guided decoding: the spec every engine gets, and its compiled grammar when the engine applies
    our masks (None when the engine enforces the spec itself)."""

    spec: GuidedSpec
    compiled: CompiledGrammar | None = None


async def guidance_for(spec: GuidedSpec, scheduler: Any) -> Guidance:
    """Compile `spec` for the model when its engine needs masks; otherwise pass it on as it is."""
    if engine_enforces_specs(scheduler):
        return Guidance(spec)
    # a spec that names no field (built outside a request) is reported as vLLM's structured_outputs
    return Guidance(spec, await decoder_for(scheduler).compile(spec, spec.param or "structured_outputs"))


def request_spec(req: Any) -> GuidedSpec | None:
    """The constraint a request asks for with `response_format` (OpenAI) or `structured_outputs` (vLLM), checked,
    naming the request field that errors name (`param`); None for none."""
    fmt, wanted = req.response_format, req.structured_outputs
    if fmt is not None and fmt.type == "json_object":
        return json_spec({"type": "object"}, "response_format")
    if fmt is not None and fmt.type == "json_schema":
        return json_spec(fmt.json_schema.schema_, "response_format", "response_format.json_schema.schema")
    if wanted is None:
        return None
    param = "structured_outputs"
    if wanted.json_object:
        return json_spec({"type": "object"}, param)
    if wanted.json_ is not None:
        schema = wanted.json_
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise InvalidRequestError("structured_outputs.json is not valid JSON", param=param) from None
        return json_spec(schema, param, "structured_outputs.json")
    if wanted.regex is not None:
        return GuidedSpec("regex", wanted.regex, param)
    if wanted.choice is not None:
        return GuidedSpec("choice", list(wanted.choice), param)
    return GuidedSpec("lark", wanted.grammar, param)


async def request_guidance(req: Any, scheduler: Any) -> Guidance | None:
    """`request_spec`, prepared for the model's engine."""
    spec = request_spec(req)
    return None if spec is None else await guidance_for(spec, scheduler)
