"""Decoupled: one response per number below IN. Negative IN is refused (400); IN == 99 breaks mid-stream (500)."""

import numpy as np


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = int(r["IN"][0])
            out.append(ValueError("IN must be non-negative") if n < 0 else self._count(n))
        return out

    def _count(self, n):
        for i in range(n):
            if n == 99 and i == 1:
                raise RuntimeError("broken generator with a secret-token")
            yield {"OUT": np.array([i], dtype=np.int32)}
