"""The tensor-model runtime, below every frontend: a model's versions with their backend instances, batchers,
rate-limiter gates and statistics; input checks against the config; ensembles; the embedding contract. KServe v2
(HTTP and gRPC), /v1/embeddings and rerank all call it."""
