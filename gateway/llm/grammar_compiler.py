"""A model's grammar compiler: JSON schemas and grammars compiled with llguidance, checked and cached per model.

Each served LLM holds one `GuidedDecoder` (`LoadedLLM.grammar`). What it compiles runs as the `GrammarConstraint`s
of `engines/grammar.py`: the engine's sampler asks each sequence's constraint for the allowed-token mask right
before sampling and the scheduler reports each sampled token back, so `response_format` and forced tool calls can
only produce text the grammar accepts; once the grammar is complete only end-of-sequence tokens are allowed.

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

A request's constraint is first described as an engine-agnostic `GuidedSpec` (engines/types.py,
gateway/openai/guided.py); it is compiled here only for engines that apply masks. Engines that enforce specs
themselves (vLLM's structured outputs, remote upstreams; `AsyncGenerateEngine.enforces_guided_spec`) get the spec
alone, so llguidance is imported lazily: a vLLM-backed model never loads it here (vLLM brings its own).
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engines.grammar import CompiledGrammar, short_error
from engines.interface import Tokenizer
from engines.types import JSON_FORMAT, GuidedSpec
from gateway.errors import InvalidRequestError

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
        raise InvalidRequestError(
            f"{where} has an object with more than {MAX_OBJECT_PROPERTIES} properties", param=param
        )
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


def choice_grammar(choices: list[str]) -> str:
    """The Lark grammar accepting exactly one of `choices`."""
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


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

                hf: Any = getattr(self._tokenizer, "hf", None)
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
            raise InvalidRequestError(
                f"the grammar cannot be used for guided decoding: {short_error(matcher.get_error())}", param=param
            )
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
                raise InvalidRequestError(
                    f"the grammar cannot be used for guided decoding: {short_error(str(exc))}", param=param
                ) from None
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
