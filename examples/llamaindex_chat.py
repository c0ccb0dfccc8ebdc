"""LlamaIndex's OpenAILike against Switchyard: chat (is_chat_model=True) and plain completion (False).

pip install llama-index-llms-openai-like
python examples/llamaindex_chat.py
"""

from _common import API_KEY, BASE_URL, MODEL
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

chat_llm = OpenAILike(
    model=MODEL,
    api_base=BASE_URL,
    api_key=API_KEY,
    is_chat_model=True,
    context_window=8192,
    temperature=0,
    max_tokens=60,
)
print(chat_llm.chat([ChatMessage(role="user", content="What is the capital of France?")]).message.content)
for delta in chat_llm.stream_chat([ChatMessage(role="user", content="Count from 1 to 5.")]):
    print(delta.delta, end="", flush=True)
print()

# is_chat_model=False sends /v1/completions with the raw prompt
text_llm = OpenAILike(
    model=MODEL,
    api_base=BASE_URL,
    api_key=API_KEY,
    is_chat_model=False,
    context_window=8192,
    temperature=0,
    max_tokens=8,
)
print(repr(text_llm.complete("The capital of France is").text))
