"""What the server tells about itself: Prometheus metrics (`metrics.py`, read at scrape time), per-request LLM
metrics (`request_metrics.py`), Triton-shaped inference statistics (`inference_stats.py`), HTTP
requests by endpoint (`http_metrics.py`) and OpenTelemetry traces (`tracing.py`)."""
