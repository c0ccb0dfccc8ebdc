"""Sums IN over a sequence through implicit state (ACC_IN -> ACC_OUT) and counts calls per CORRID in memory."""

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.calls = {}

    def execute(self, requests):
        responses = []
        for r in requests:
            assert r["READY"].dtype == np.float32 and float(r["READY"][0, 0]) == 1.0
            corrid = int(r["CORRID"][0, 0])
            if int(r["START"][0, 0]) == 1:
                self.calls[corrid] = 0
            self.calls[corrid] = self.calls.get(corrid, 0) + 1
            calls = self.calls[corrid]
            if bool(r["END"][0, 0]):
                del self.calls[corrid]
            total = (r["ACC_IN"] + r["IN"]).astype(np.int32)
            responses.append({"OUT": total, "ACC_OUT": total, "CALLS": np.full_like(total, calls)})
        return responses
