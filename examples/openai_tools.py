"""Tool calling with the openai SDK: the model calls a function, we run it, and send the result back.

`tool_choice="required"` (or naming a function) makes the server constrain the output, so the arguments always
parse and match the function's JSON Schema, even from a small model. With "auto" the model decides.

    python examples/openai_tools.py
"""

import json

from _common import API_KEY, BASE_URL, MODEL
from openai import OpenAI

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"],
            },
        },
    }
]


def get_weather(city: str, unit: str) -> str:
    return json.dumps({"city": city, "temperature": 22 if unit == "celsius" else 72, "unit": unit})


messages = [{"role": "user", "content": "What is the weather in Paris?"}]
response = client.chat.completions.create(
    model=MODEL, messages=messages, tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=0
)
message = response.choices[0].message
print("finish_reason:", response.choices[0].finish_reason)
messages.append(message.model_dump(exclude_none=True))
for call in message.tool_calls:
    args = json.loads(call.function.arguments)
    print(f"call {call.id}: {call.function.name}({args})")
    messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(**args)})

final = client.chat.completions.create(
    model=MODEL, messages=messages, tools=tools, tool_choice="none", temperature=0, max_tokens=60
)
print("answer:", final.choices[0].message.content)
