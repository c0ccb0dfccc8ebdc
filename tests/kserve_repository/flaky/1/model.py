"""Refuses negative inputs with a message; raises (with a secret in the message) on 13."""

import numpy as np


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            value = int(r["IN"][0])
            if value == 13:
                raise RuntimeError("unlucky: secret-token-do-not-leak /opt/internal/path")
            if value < 0:
                out.append(ValueError("IN must be non-negative"))
            else:
                out.append({"OUT": np.array([value * 2], dtype=np.int32)})
        return out
