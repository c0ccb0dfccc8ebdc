"""/v1/models' entries under on_demand: every model a request may name, with its state, in OpenAI's shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai.types import Model

from gateway.errors import ModelNotFoundError
from gateway.openai.model_cards import model_card, model_cards
from gateway.repository.model_control import ModelControl
from tests.gateway.repository.tiny_models import write_tagger


async def test_cards_list_loaded_and_loadable_models_with_their_state(tmp_path: Path) -> None:
    write_tagger(tmp_path, "a")
    write_tagger(tmp_path, "b")
    broken = write_tagger(tmp_path, "broken")
    (broken / "1" / "model.py").write_text("raise ImportError('no such backend library')\n")
    control = ModelControl(tmp_path, control_mode="on_demand", memory_budget=10**12)
    control.prepare()
    await control.start_all(control.load_all())
    try:
        await control.models.acquire("a")
        with pytest.raises(Exception, match="no such backend library"):
            await control.models.acquire("broken")
        cards = {card["id"]: card for card in model_cards(control)}
        assert {name: card["state"] for name, card in cards.items()} == {
            "a": "loaded",
            "b": "not-loaded",
            "broken": "failed",
        }
        assert "no such backend library" in cards["broken"]["reason"]
        for card in cards.values():
            Model.model_validate(card)  # OpenAI's SDK reads every entry
        assert model_card(control, "b")["state"] == "not-loaded"
        with pytest.raises(ModelNotFoundError):
            model_card(control, "nope")
    finally:
        await control.close()
        for model in control.models.all_models():
            await model.stop()
