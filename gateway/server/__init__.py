"""Running the HTTP server around the frontends: the checks every request passes (`access.py`), request ids
and the log format (`request_log.py`), graceful shutdown (`lifecycle.py`), the bound on request heads
(`http_limits.py`), the settings table of the docs (`settings_table.py`), Ray Serve replicas (`ray_serve.py`)
and the cap on malloc's arenas (`allocator.py`)."""
