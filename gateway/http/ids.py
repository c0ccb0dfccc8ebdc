"""Random ids for requests, responses, choices and tool calls.

They only need to be unique, not secret, so they come from `random` (no system call). `uuid.uuid4()` reads
`os.urandom`, which releases the GIL; with an engine thread busy in Python, the event loop then waits to get it
back, and under embeddings load that wait was a quarter of the event loop's time per request (py-spy).
"""

from __future__ import annotations

import random


def random_hex() -> str:
    """32 random hex digits, like `uuid.uuid4().hex`."""
    return f"{random.getrandbits(128):032x}"
