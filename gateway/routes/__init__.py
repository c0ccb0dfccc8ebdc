"""Routes: model aliases, ordered fallbacks, weighted splits and retries in front of the served models
(docs/routes.md)."""
