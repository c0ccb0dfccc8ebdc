"""Parses each "x, y" text into two floats (the circle classifier's FEATURES); refuses anything else."""

import numpy as np


class TritonPythonModel:
    def execute(self, requests):
        return [self._parse(request["TEXT"]) for request in requests]

    @staticmethod
    def _parse(texts):
        rows = []
        for raw in texts.ravel():
            parts = raw.decode("utf-8", "replace").replace(";", ",").split(",")
            try:
                x, y = (float(p) for p in parts)
            except ValueError:
                return ValueError('TEXT must look like "x, y" (two numbers)')
            rows.append([x, y])
        return {"FEATURES": np.array(rows, dtype=np.float32)}
