"""Chat with the openai SDK.

    switchyard serve --model-repository model_repository      # in another terminal
    python examples/openai_chat.py

Greedy decoding (temperature 0) of the default model answers "The capital of France is Paris."
"""

from _common import API_KEY, BASE_URL, MODEL
from openai import OpenAI

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
response = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    temperature=0,
)
print(response.choices[0].message.content)
print(f"usage: {response.usage.prompt_tokens} prompt + {response.usage.completion_tokens} completion tokens")
