"""Stream a chat answer token by token with the openai SDK (server-sent events), usage at the end.

python examples/openai_streaming.py
"""

from _common import API_KEY, BASE_URL, MODEL
from openai import OpenAI

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
stream = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Write a haiku about the sea."}],
    max_tokens=60,
    stream=True,
    stream_options={"include_usage": True},  # a last chunk with no choices carries the token counts
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\n[{chunk.usage.completion_tokens} tokens]")
