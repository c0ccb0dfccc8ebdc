"""Switchyard gateway: HTTP/gRPC-facing, engine-agnostic serving layer."""

__version__ = "0.1.0"
