"""LABEL = the most likely class name (from the `labels` parameter), SCORE = its probability."""

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.labels = [label.encode() for label in args["parameters"]["labels"].split(",")]

    def execute(self, requests):
        responses = []
        for request in requests:
            probs = request["PROBABILITIES"]
            best = probs.argmax(axis=1)
            responses.append(
                {
                    "LABEL": np.array([[self.labels[i]] for i in best], dtype=object),
                    "SCORE": probs.max(axis=1, keepdims=True).astype(np.float32),
                }
            )
        return responses
