"""Structured output: the answer is forced to match a JSON Schema (guided decoding on the server).

Two ways with the openai SDK: `response_format={"type": "json_schema", ...}` by hand, and `parse()` with a
pydantic model, which builds the schema and parses the answer back into the model.

    python examples/openai_structured_output.py
"""

import json

from _common import API_KEY, BASE_URL, MODEL
from openai import OpenAI
from pydantic import BaseModel

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)

schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "continent": {"enum": ["Africa", "America", "Asia", "Europe", "Oceania"]},
    },
    "required": ["city", "country", "continent"],
}
response = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Paris is the capital of France. Give the city, country and continent."}],
    response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}},
    temperature=0,
)
print(json.loads(response.choices[0].message.content))


class Person(BaseModel):
    name: str
    age: int


parsed = client.chat.completions.parse(
    model=MODEL,
    messages=[{"role": "user", "content": "Extract the person: Ada Lovelace is 36 years old."}],
    response_format=Person,
    temperature=0,
)
print(repr(parsed.choices[0].message.parsed))
