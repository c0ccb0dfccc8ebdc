"""OpenAI's Files and Batch APIs: `/v1/files` keeps uploads on disk, `/v1/batches` runs a JSONL file of requests
through the in-process serving path at the lowest priority and writes the answers as output files (docs/batch-api.md).
"""
