"""The model repository: layout on disk, typed model configs, and the registry of loaded models."""
