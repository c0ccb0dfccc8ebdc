"""Named API keys with policies and usage (docs/keys.md).

`policy.py` says what a key may do, `store.py` keeps keys and usage in a database (SQLite by default, any SQLAlchemy
URL), `limits.py` decides whether a key's request may start now, `usage.py` accumulates usage and writes it in
batches, `service.py` ties them together for the access checks, `context.py` carries the current request's key to
the frontends (model access, priority, token charges) and `admin.py` is the `/admin/keys` and `/admin/usage` API.
"""
