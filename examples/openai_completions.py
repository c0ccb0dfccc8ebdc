"""Plain text completion (/v1/completions) with the openai SDK: one prompt, then a batch of two with n=2.

python examples/openai_completions.py
"""

from _common import API_KEY, BASE_URL, MODEL
from openai import OpenAI

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
one = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
print(repr(one.choices[0].text))

batch = client.completions.create(model=MODEL, prompt=["Once upon a time", "In a galaxy"], max_tokens=8, n=2, seed=1)
for choice in batch.choices:  # index = prompt * n + sample
    print(choice.index, repr(choice.text))
