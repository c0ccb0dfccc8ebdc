"""OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""


class TritonPythonModel:
    offset = 0.0

    def execute(self, requests):
        return [
            {"OUTPUT0": r["INPUT0"] + r["INPUT1"] + self.offset, "OUTPUT1": r["INPUT0"] - r["INPUT1"]} for r in requests
        ]
