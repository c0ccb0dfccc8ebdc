"""llama.cpp in-process, for bench/llamacpp_bench.py: runs under the llama.cpp environment's Python (only the
standard library and llama_cpp), loads one GGUF file once and answers timing requests over stdin/stdout.

    <llama python> bench/llamacpp_inprocess.py MODEL.gguf --threads 2 --n-ctx 2048

First line out: {"eog": [ids llama.cpp ends a generation at], "n_vocab": N}. Then, per JSON line in
({"prompt": text, "max_tokens": n, "logit_bias": {id: bias}}), one JSON line out: {"ttft": s, "total": s,
"tokens": n, "finish_reason": ..., "text": ..., "prompt_tokens": n}, measured around
`Llama.create_completion(stream=True)` with greedy sampling: the Python API a llama-cpp-python user calls, without
HTTP.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import llama_cpp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=2048)
    args = parser.parse_args()
    llm = llama_cpp.Llama(
        model_path=args.model, n_threads=args.threads, n_threads_batch=args.threads, n_ctx=args.n_ctx, verbose=False
    )
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()
    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    print(json.dumps({"eog": eog, "n_vocab": n_vocab}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        bias = {int(k): float(v) for k, v in (request.get("logit_bias") or {}).items()}
        llm.reset()  # no prompt reuse between requests (the servers get distinct prompts too)
        start = time.perf_counter()
        ttft, tokens, finish, text = 0.0, 0, None, []
        for chunk in llm.create_completion(
            request["prompt"], max_tokens=request["max_tokens"], temperature=0.0, stream=True, logit_bias=bias or None
        ):
            choice = chunk["choices"][0]
            if choice.get("text"):
                if not ttft:
                    ttft = time.perf_counter() - start
                text.append(choice["text"])
                tokens += 1
            finish = choice.get("finish_reason") or finish
        total = time.perf_counter() - start
        prompt_tokens = len(llm.tokenize(request["prompt"].encode("utf-8"), special=True))  # as create_completion
        print(
            json.dumps(
                {
                    "ttft": ttft,
                    "total": total,
                    "tokens": tokens,
                    "finish_reason": finish,
                    "text": "".join(text),
                    "prompt_tokens": prompt_tokens,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
