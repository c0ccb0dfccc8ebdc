"""Where the examples find the server: SWITCHYARD_BASE_URL (default http://127.0.0.1:8000/v1) and
SWITCHYARD_MODEL (default smollm2-135m-instruct, the model the default repository serves)."""

import os

BASE_URL = os.environ.get("SWITCHYARD_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("SWITCHYARD_MODEL", "smollm2-135m-instruct")
API_KEY = os.environ.get("SWITCHYARD_API_KEY", "unused")  # sent as a Bearer token; ignored unless auth is on
