"""Tool calling for chat: checks `tools`/`tool_choice`, takes the model's dialect (`LoadedLLM.parsers`), and builds
the constraint.

`tool_choice`:
* `none`  -- tools are left out of the prompt and the answer is plain text;
* `auto`  -- tools go into the prompt and the answer is parsed with the model's dialect (gateway/llm/tool_parsers/);
* `required` / a named function -- the answer is grammar-constrained to the dialect's call format, with the
  arguments constrained to the tool's JSON Schema, so the calls always parse and validate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engines.types import GuidedSpec
from gateway.errors import InvalidRequestError
from gateway.llm.grammar_compiler import check_json_schema
from gateway.llm.tool_parsers import ToolParser
from gateway.openai.guided import Guidance
from gateway.openai.protocol import ChatCompletionRequest, NamedToolChoice
from gateway.repository.registry import LoadedLLM


@dataclass
class ToolPlan:
    """What a request asks of tools, checked."""

    choice: str  # "none" | "auto" | "required" | "named"
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool dicts, as the template wants them
    parser: ToolParser | None = None
    parallel: bool = True
    forced: list[dict[str, Any]] = field(default_factory=list)  # the tools a constrained answer may call

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    @property
    def call_names(self) -> set[str]:
        """The tools the answer may call: a constrained answer only the forced ones."""
        return {t["function"]["name"] for t in self.forced} if self.constrained else self.names

    @property
    def active(self) -> bool:
        """Whether the answer is read for tool calls."""
        return self.choice != "none" and bool(self.tools)

    @property
    def constrained(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def max_calls(self) -> int:
        return 1_000_000 if self.parallel and self.choice != "named" else 1


def plan_tools(req: ChatCompletionRequest, model: LoadedLLM) -> ToolPlan:
    tools = [t.model_dump(exclude_none=True, by_alias=True) for t in req.tools or []]
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        fn = tool["function"]
        if fn["name"] in seen:
            raise InvalidRequestError(f"tools[{i}]: duplicate function name '{fn['name']}'", param="tools")
        seen.add(fn["name"])
        if "parameters" in fn:
            check_json_schema(fn["parameters"], "tools", f"tools[{i}].function.parameters")
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in seen:
            raise InvalidRequestError(
                f"tool_choice names function '{choice.function.name[:64]}', which is not in tools", param="tool_choice"
            )
        named = [t for t in tools if t["function"]["name"] == choice.function.name]
        plan = ToolPlan("named", tools, parallel=False, forced=named)
    elif choice in ("required", "auto"):
        if not tools and choice == "required":
            raise InvalidRequestError("tool_choice 'required' needs at least one tool in tools", param="tool_choice")
        plan = ToolPlan(choice, tools, parallel=req.parallel_tool_calls, forced=tools)
    else:
        return ToolPlan("none")
    if plan.active:
        plan.parser = model.parsers.tool
    return plan


async def tool_guidance(plan: ToolPlan, model: LoadedLLM) -> Guidance | None:
    """The grammar forcing a call (required / named) in the dialect's own format, or None.

    The spec is the dialect's Lark grammar with each tool's schema embedded, so whichever engine enforces it (our
    masks, vLLM's guidance backend, an upstream) the answer parses with the same tool parser.
    """
    if not plan.constrained or plan.parser is None:
        return None
    spec = GuidedSpec("lark", plan.parser.grammar(plan.forced, plan.parallel and plan.choice == "required"), "tools")
    if model.enforces_guided_spec:
        return Guidance(spec)  # the schemas were checked by plan_tools; the engine compiles
    decoder = model.grammar
    for tool in plan.forced:
        # Each schema on its own first: an unsatisfiable one (e.g. {"$ref": "#"}) shows at its first mask, which
        # inside the call grammar would only come after the function name.
        if "parameters" in tool["function"]:
            where = f"tools[{plan.tools.index(tool)}].function.parameters"
            await decoder.json_schema(tool["function"]["parameters"], "tools", where)
    return Guidance(spec, await decoder.compile(spec, "tools"))
