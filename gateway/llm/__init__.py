"""What one served LLM owns beside its engine and scheduler, built once per model and held by its `LoadedLLM`
(gateway/repository/loaded_model.py): the chat template's probed support, the tool-call and reasoning parsers, and
the grammar compiler."""
