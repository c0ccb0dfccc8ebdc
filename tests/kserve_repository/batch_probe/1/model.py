"""Y = X * 10, plus what the call saw: ROWS (all rows of all requests) and REQUESTS (how many requests)."""

import time

import numpy as np


class TritonPythonModel:
    def execute(self, requests):
        delay = max((int(r["DELAY_MS"].max()) for r in requests if "DELAY_MS" in r), default=0)
        if delay:
            time.sleep(delay / 1000)
        rows = sum(r["X"].shape[0] for r in requests)
        return [
            {
                "Y": r["X"] * 10,
                "ROWS": np.full((r["X"].shape[0], 1), rows, dtype=np.int32),
                "REQUESTS": np.full((r["X"].shape[0], 1), len(requests), dtype=np.int32),
            }
            for r in requests
        ]
