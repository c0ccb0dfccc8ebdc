"""LangChain's ChatOpenAI against Switchyard: invoke, stream, structured output and tools.

pip install langchain-openai
python examples/langchain_chat.py
"""

from _common import API_KEY, BASE_URL, MODEL
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

llm = ChatOpenAI(base_url=BASE_URL, api_key=API_KEY, model=MODEL, temperature=0, max_tokens=60)

print(llm.invoke("What is the capital of France?").content)

for chunk in llm.stream("Count from 1 to 5."):
    print(chunk.content, end="", flush=True)
print()


class City(BaseModel):
    name: str
    country: str


structured = llm.with_structured_output(City, method="json_schema")  # enforced by guided decoding
print(repr(structured.invoke("Paris is the capital of France. Name the city and its country.")))


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"22 degrees in {city}"


with_tools = llm.bind_tools([get_weather], tool_choice="get_weather")  # a named tool choice is constrained
message = with_tools.invoke("What is the weather in Paris?")
print(message.tool_calls)
