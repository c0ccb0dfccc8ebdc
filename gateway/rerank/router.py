"""POST /v1/rerank (and the /v2/rerank alias Cohere's v2 client calls) and POST /v1/score, served by an embedding
model (see similarity.py). Same auth, limits and OpenAI error shape as the other /v1 routes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import InvalidRequestError
from gateway.http.body_depth import NestingAwareRoute
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.unknown_fields import log_unknown
from gateway.openai.results import new_id, now
from gateway.rerank.protocol import RerankRequest, ScoreRequest
from gateway.rerank.similarity import similarities

router = APIRouter(route_class=NestingAwareRoute)


@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
    log_unknown(body, "rerank")
    model = await request.app.state.registry.acquire(body.model)
    documents = [d if isinstance(d, str) else d.text for d in body.documents]
    scores, tokens = await cancel_on_disconnect(
        request, similarities(model, [body.query], documents, ("query", "documents"))
    )
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[: body.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return {
        "id": new_id("rerank"),
        "model": model.name,
        "results": results,
        "usage": {"total_tokens": tokens},
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
    }


@router.post("/v1/score")
async def score(body: ScoreRequest, request: Request) -> dict[str, Any]:
    log_unknown(body, "score")
    left = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    right = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    if not left or not right:
        raise InvalidRequestError("text_1 and text_2 must not be empty", param="text_1" if not left else "text_2")
    if len(left) != 1 and len(left) != len(right):
        raise InvalidRequestError(
            f"text_1 has {len(left)} texts and text_2 {len(right)}: give one text_1, or as many as text_2",
            param="text_1",
        )
    model = await request.app.state.registry.acquire(body.model)
    scores, tokens = await cancel_on_disconnect(request, similarities(model, left, right, ("text_1", "text_2")))
    return {
        "id": new_id("score"),
        "object": "list",
        "created": now(),
        "model": model.name,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
