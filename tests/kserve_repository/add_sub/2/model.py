"""Version 2: like version 1 but OUTPUT0 is offset by 100, so tests can tell the versions apart."""


class TritonPythonModel:
    def execute(self, requests):
        return [{"OUTPUT0": r["INPUT0"] + r["INPUT1"] + 100.0, "OUTPUT1": r["INPUT0"] - r["INPUT1"]} for r in requests]
