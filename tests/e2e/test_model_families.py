"""Models of several families, served by the native engine from HF folders in a model repository, answer through the
openai SDK with the text transformers' float32 greedy generate writes; a model of a family the engine does not serve
is refused at load with the reason on /v2/repository/index, and the others serve beside it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import ADMIN_HEADERS, ADMIN_KEY, ServerProcess
from tests.family_models import family_folder

FAMILIES = ("gemma2", "gemma3", "phi3_longrope", "granite", "olmo2", "mistral")
PROMPT = "The three most important rivers of Europe are"
MAX_TOKENS = 12
CONFIG = """
backend: pytorch
model: hf
dtype: float32
max_model_len: 512
kv_cache: {max_tokens: 1024}
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("families")
    for name in FAMILIES:
        shutil.copytree(family_folder(name), repo / name / "hf")
        (repo / name / "config.yaml").write_text(CONFIG)
    falcon = repo / "falcon" / "hf"
    falcon.mkdir(parents=True)
    (falcon / "config.json").write_text(json.dumps({"model_type": "falcon", "architectures": ["FalconForCausalLM"]}))
    (repo / "falcon" / "config.yaml").write_text(CONFIG)
    key_file = repo.parent / "admin-key"
    key_file.write_text(ADMIN_KEY + "\n")
    loads = [arg for name in FAMILIES for arg in ("--load-model", name)]
    proc = ServerProcess(repo, "--model-control-mode", "explicit", *loads, "--admin-key-file", str(key_file))
    try:
        yield proc
    finally:
        proc.stop()


def test_each_family_answers_as_transformers(served: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    for name in FAMILIES:
        got = client.completions.create(model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        folder = family_folder(name)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        # transformers' eager attention: its default (SDPA) leaves out Gemma 2's soft-capping of the scores
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
        ids = tokenizer(PROMPT, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)[0, ids.shape[1] :]
        assert got.choices[0].text == tokenizer.decode(out, skip_special_tokens=True), name


def test_an_unsupported_family_is_refused_with_the_fix(served: ServerProcess) -> None:
    """Loading it answers 400 with the reason (model type, the families served, `backend: vllm`); the index keeps
    the reason, and the other models keep serving."""
    http = httpx.Client(base_url=served.base_url, timeout=120, headers=ADMIN_HEADERS)
    response = http.post("/v2/repository/models/falcon/load")
    assert response.status_code == 400 and "backend: vllm" in response.json()["error"], response.text
    rows = {r["name"]: r for r in http.post("/v2/repository/index").json()}
    assert rows["falcon"]["state"] == "UNAVAILABLE"
    reason = rows["falcon"]["reason"]
    assert "'falcon'" in reason and "backend: vllm" in reason and "gemma2" in reason, reason
    assert all(rows[name]["state"] == "READY" for name in FAMILIES)
