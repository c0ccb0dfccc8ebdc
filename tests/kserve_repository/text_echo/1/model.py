"""UPPER = the text upper-cased plus the `suffix` parameter; LENGTH = its length in bytes."""

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.suffix = args["parameters"]["suffix"].encode()

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = request["TEXT"]
            upper = np.array([[t.upper() + self.suffix] for t in texts[:, 0]], dtype=object)
            length = np.array([[len(t)] for t in texts[:, 0]], dtype=np.int32)
            responses.append({"UPPER": upper, "LENGTH": length})
        return responses
