"""The bodies of /api/tags, /api/show and /api/ps, from a listed model (listing.py) and its facts (model_facts.py).

Names are the served names, without Ollama's `:latest` tag (requests may add it). `capabilities`: `completion` and
`tools` for every LLM (tools go through the model's tool-call dialect), `thinking` for a model with a reasoning
parser, `embedding` for an embedding model; never `vision`. `template` is the model's chat template as it is (Jinja,
which the server renders; Ollama's are Go templates), `parameters` and `modelfile` say what the server serves with
(the context length, and the stop tokens once the model is loaded). A model that is not loaded is described from its
config and files alone: the same details, template and capabilities, its context length from its config or its
weights' metadata. /api/ps's `expires_at` is when the model unloads if no request comes (its keep-alive less its
idle time), or as Ollama writes `keep_alive: -1` for a model that is never unloaded on its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.errors import InternalError
from gateway.llm.reasoning import AUTO, reasoning_parser_for
from gateway.llm.template_support import template_text
from gateway.ollama.listing import Listed, config_embeds
from gateway.ollama.lookup import embeds
from gateway.ollama.model_facts import Facts, parameter_size
from gateway.repository.loaded_model import LoadedLLM, LoadedModel
from gateway.repository.model_config import ModelConfig

NEVER = timedelta(microseconds=(2**63 - 1) // 1000)  # Ollama's expiry for keep_alive < 0 (about 292 years)


def timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def thinks(model: LoadedLLM) -> bool:
    """Whether the model's answers are split into reasoning and content (its reasoning parser)."""
    return model.parsers.reasoning is not None


def _reasons(config: ModelConfig, template: str) -> bool:
    """Whether a model that is not loaded splits its answers into reasoning and content (as `thinks`)."""
    setting = str((config.parameters or {}).get("reasoning_parser", AUTO))
    try:
        return reasoning_parser_for(setting, (template or None) if setting == AUTO else None) is not None
    except InternalError:
        return False


def capabilities(item: Listed, facts: Facts) -> list[str]:
    model = item.entry
    if isinstance(model, LoadedLLM):
        return ["completion", "tools", *(["thinking"] if thinks(model) else [])]
    if model is not None:
        return ["embedding"] if embeds(model) else []
    if isinstance(item.config, ModelConfig):
        return ["completion", "tools", *(["thinking"] if _reasons(item.config, facts.chat_template) else [])]
    return ["embedding"] if config_embeds(item.config) else []


def context_length(item: Listed, facts: Facts) -> int | None:
    """The context window: the loaded model's, else its config's `max_model_len`, else its weights' own."""
    if item.entry is not None:
        return item.entry.max_model_len
    if not isinstance(item.config, ModelConfig):
        return None
    arch = facts.info.get("general.architecture") or facts.family
    own = facts.info.get(f"{arch}.context_length")
    return item.config.max_model_len or (own if isinstance(own, int) else None)


def details(facts: Facts) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": facts.format,
        "family": facts.family,
        "families": [facts.family] if facts.family else None,
        "parameter_size": parameter_size(facts.parameter_count),
        "quantization_level": facts.quantization,
    }


def tag_entry(name: str, facts: Facts) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "modified_at": timestamp(facts.modified),
        "size": facts.size,
        "digest": facts.digest,
        "details": details(facts),
    }


def _stops(model: LoadedLLM) -> list[str]:
    tokenizer = model.scheduler.tokenizer
    return [
        s for s in (tokenizer.decode([t], skip_special_tokens=False) for t in model.scheduler.info.eos_token_ids) if s
    ]


def _parameters(item: Listed, facts: Facts) -> list[tuple[str, str]]:
    if not isinstance(item.config, ModelConfig):
        return []
    window = context_length(item, facts)
    stops = _stops(item.entry) if isinstance(item.entry, LoadedLLM) else []
    return [*([("num_ctx", str(window))] if window else []), *(("stop", f'"{s}"') for s in stops)]


def _template(item: Listed, facts: Facts) -> str:
    if isinstance(item.entry, LoadedLLM):
        return template_text(item.entry.scheduler.tokenizer) or ""
    return facts.chat_template if item.entry is None and isinstance(item.config, ModelConfig) else ""


def show_body(item: Listed, facts: Facts) -> dict[str, Any]:
    template = _template(item, facts)
    params = _parameters(item, facts)
    modelfile = [
        (
            f"# Modelfile of '{item.name}', generated by Switchyard: the model is served from the folder "
            f"'{item.folder}' of its model repository; change its config file there."
        ),
        f"FROM {facts.source or item.folder}",
    ]
    if template:
        modelfile.append(f'TEMPLATE """{template}"""')
    modelfile += [f"PARAMETER {key} {value}" for key, value in params]
    info = dict(facts.info)
    arch = info.get("general.architecture") or facts.family
    window = context_length(item, facts)
    if arch and window:
        info.setdefault(f"{arch}.context_length", window)
    return {
        "license": "",
        "modelfile": "\n".join(modelfile) + "\n",
        "template": template,
        "parameters": "\n".join(f"{key:<30} {value}" for key, value in params),
        "details": details(facts),
        "model_info": info,
        "capabilities": capabilities(item, facts),
        "modified_at": timestamp(facts.modified),
    }


def ps_entry(model: LoadedModel, facts: Facts, seconds_left: float | None) -> dict[str, Any]:
    """A loaded model: `size` is its weights' bytes on disk plus, for an LLM, its KV pool's (CPU memory: no VRAM);
    `seconds_left` until it unloads if no request comes (None: never on its own)."""
    size = facts.size
    if isinstance(model, LoadedLLM):
        info = model.scheduler.info
        size += info.num_kv_blocks * info.block_size * info.kv_bytes_per_token
    expires = datetime.now(UTC) + (NEVER if seconds_left is None else timedelta(seconds=seconds_left))
    return {
        "name": model.name,
        "model": model.name,
        "size": size,
        "digest": facts.digest,
        "details": details(facts),
        "expires_at": expires.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "size_vram": 0,
        "context_length": model.max_model_len,
    }
