"""The import layers of `gateway/` and `engines/`, read from the source (no import runs), and no import circles.

The rules are the table under "Source layout" in docs/architecture.md, parsed here, so the page and the test cannot
drift: the app (`role: app`) assembles the frontends; the frontends (`frontend`, `adapter`) stand side by side and
never import each other, but for the adapters, which translate their protocol into the OpenAI path (and `openai/`
never imports them); below them (`below`, `bottom`) nothing knows a frontend, and the `bottom` pieces import only
what their row names; the engines know nothing of `gateway/`. Imports under `if TYPE_CHECKING:` count: a circle of
types is still a circle. A loaded model is typed by its kind (`LoadedLLM`, `LoadedTensorModel`), never by an untyped
`tensor: Any` and a `tensor is None` switch.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "engines")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROLES = {"app", "frontend", "adapter", "below", "bottom", "engines"}


def _layer_table() -> list[tuple[str, list[str], list[str]]]:
    """(role, modules, may import) per row of the page's table, the module names as written in backticks."""
    text = ARCHITECTURE.read_text()
    found = re.search(r"<!-- import layers:.*?-->\n(.*?)<!-- end of the import layers -->", text, re.S)
    assert found, f"{ARCHITECTURE.relative_to(ROOT)} lost its import layers table (and its two marker comments)"
    rows = []
    for line in found.group(1).strip().splitlines()[2:]:  # past the header and the --- line
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 3 and cells[0] in ROLES, f"not a row of role | modules | may import: {line}"
        names = [re.findall(r"`([\w.]+)`", cell) for cell in cells[1:]]
        rows.append((cells[0], names[0], [n for n in names[1] if n.split(".")[0] in PACKAGES]))
    return rows


LAYERS = _layer_table()
#: API frontends: sub-packages of gateway/ that serve one protocol (both frontend and adapter rows).
FRONTENDS = tuple(m.split(".")[1] for role, modules, _ in LAYERS if role in ("frontend", "adapter") for m in modules)
#: Frontends that translate their protocol into the OpenAI path (chat, embeddings) instead of repeating it, as
#: LiteLLM and vLLM do: they may import the frontend their row names, which never imports them.
ADAPTERS = {
    m.split(".")[1]: may[0].split(".")[1] for role, modules, may in LAYERS if role == "adapter" for m in modules
}
#: Modules allowed to import frontends: they assemble the server.
ASSEMBLY = {m for role, modules, _ in LAYERS if role == "app" for m in modules}
#: The runtime every frontend calls (the `below` row's packages: which model answers a name and its lifecycle, the
#: tensor-model runtime, the schedulers, the KV cache). It serves every protocol, so it imports none.
RUNTIME = tuple(m for role, modules, _ in LAYERS if role == "below" for m in modules)
#: Shared pieces at the bottom of gateway/: they may import nothing of gateway/ but these.
BOTTOM = {m: set(may) for role, modules, may in LAYERS if role == "bottom" for m in modules}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The project module an imported name lives in (`gateway.kserve.codec.InputTensor` -> `gateway.kserve.codec`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, path: Path) -> Iterator[str]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*parent, base] if base else parent)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES and (owner := _owner(name)) and owner != module:
                yield owner


GRAPH = {module: set(_imported(module, path)) for module, path in MODULES.items()}


def _frontend(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "gateway" and parts[1] in FRONTENDS else None


def _edges() -> Iterator[tuple[str, str]]:
    for module, targets in sorted(GRAPH.items()):
        for target in sorted(targets):
            yield module, target


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_is_read() -> None:
    """Guards the rules below against passing vacuously (a path or parsing mistake would leave no edges)."""
    assert {"gateway.app", "gateway.openai.router", "engines.interface"} <= MODULES.keys()
    assert "gateway.openai.router" in GRAPH["gateway.app"]
    assert "gateway.http.sse" in GRAPH["gateway.openai.router"]


def test_the_page_names_only_modules_that_exist() -> None:
    """A module moved or renamed on one side and not the other fails here: the page's table is the rule set."""
    named = {m for _, modules, may in LAYERS for m in (*modules, *may)}
    missing = sorted(named - MODULES.keys())
    assert not missing, f"docs/architecture.md's import layers table names modules that do not exist: {missing}"
    assert set(ADAPTERS.values()) <= set(FRONTENDS) and ASSEMBLY and BOTTOM and FRONTENDS


def test_every_package_of_the_gateway_has_a_row() -> None:
    """A new folder of gateway/ (a new API frontend, say) must be placed in the table, not escape the rules."""
    packages = {".".join(p.relative_to(ROOT).parts[:-1]) for p in (ROOT / "gateway").glob("*/__init__.py")}
    named = {m for _, modules, _ in LAYERS for m in modules}
    assert not packages - named, (
        f"add these packages to docs/architecture.md's import layers table: {sorted(packages - named)}"
    )


def test_every_module_at_the_gateway_root_has_a_row() -> None:
    """gateway/'s root holds only what the table names (the app, the CLI, config, errors): a new module goes into the
    package it serves, or gets a row of its own."""
    roots = {f"gateway.{p.stem}" for p in (ROOT / "gateway").glob("*.py") if p.stem != "__init__"}
    named = {m for _, modules, _ in LAYERS for m in modules}
    assert not roots - named, (
        f"move these into the package they serve (or add them to the table): {sorted(roots - named)}"
    )


def test_engines_import_nothing_of_the_gateway() -> None:
    wrong = [(m, t) for m, t in _edges() if _in(m, "engines") and _in(t, "gateway")]
    assert not wrong, f"engines/ must not import gateway/ (move the shared piece into engines/): {wrong}"


def test_frontends_never_import_each_other() -> None:
    wrong = [
        (m, t)
        for m, t in _edges()
        if _frontend(m) and _frontend(t) and _frontend(m) != _frontend(t) and ADAPTERS.get(_frontend(m)) != _frontend(t)
    ]
    assert not wrong, (
        "a frontend imports another; move what both need below them (gateway/http/, "
        f"gateway/tensor/tensors.py, or a module of its own): {wrong}"
    )


def test_nothing_below_the_frontends_imports_one() -> None:
    wrong = [(m, t) for m, t in _edges() if _frontend(t) and not _frontend(m) and m not in ASSEMBLY]
    assert not wrong, (
        "only the app assembles frontends; the scheduler, repository and shared modules must not "
        f"import one (move what they need below the frontends): {wrong}"
    )


def test_the_runtime_imports_no_frontend() -> None:
    """The runtime packages exist (so the rule below cannot pass vacuously) and reach no frontend at all."""
    for package in RUNTIME:
        assert any(_in(m, package) for m in MODULES), f"{package} is gone: update RUNTIME"
    wrong = [(m, t) for m, t in _edges() if any(_in(m, p) for p in RUNTIME) and _frontend(t)]
    assert not wrong, f"the runtime serves every frontend and imports none of them: {wrong}"


def _untyped_tensors(tree: ast.AST) -> Iterator[int]:
    """Lines that declare a `tensor` as `Any` (a field, a variable or a parameter) or switch on `tensor is None`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            target = node.target
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            annotation = node.annotation
        elif isinstance(node, ast.arg):
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            left = node.left
            named = left.id if isinstance(left, ast.Name) else getattr(left, "attr", "")
            right = node.comparators[0]
            if named == "tensor" and isinstance(right, ast.Constant) and right.value is None:
                yield node.lineno
            continue
        else:
            continue
        if name == "tensor" and annotation is not None and ast.unparse(annotation) in ("Any", "typing.Any"):
            yield node.lineno


def test_loaded_models_are_typed_by_kind() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}"
        for module, path in sorted(MODULES.items())
        if _in(module, "gateway")
        for line in _untyped_tensors(ast.parse(path.read_text(), str(path)))
    ]
    assert not wrong, (
        "a `tensor: Any` or a `tensor is None` switch: type the model by its kind (LoadedLLM, "
        f"LoadedTensorModel, TensorModel) and use isinstance: {wrong}"
    )


def test_untyped_tensors_are_found() -> None:
    """The finder itself, on the shapes it must catch and one it must leave alone."""
    source = (
        "class A:\n    tensor: Any = None\n"
        "def f(tensor: Any) -> None:\n    if model.tensor is None: pass\n"
        "def g(tensor: TensorModel) -> None: ...\n"
    )
    assert sorted(_untyped_tensors(ast.parse(source))) == [2, 3, 4]


@pytest.mark.parametrize("bottom", sorted(BOTTOM))
def test_shared_pieces_stay_at_the_bottom(bottom: str) -> None:
    wrong = [
        (m, t)
        for m, t in _edges()
        if _in(m, bottom) and _in(t, "gateway") and not _in(t, bottom) and t not in BOTTOM[bottom]
    ]
    assert not wrong, f"{bottom} is shared by every frontend and must stay free of the layers above: {wrong}"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_import_circles() -> None:
    circles = _circles(GRAPH)
    assert not circles, (
        "import circles (each list imports itself round the loop; split out the piece both sides "
        f"need, or type against a Protocol): {circles}"
    )


def test_circles_are_found() -> None:
    """The circle finder itself, on a small graph: a -> b -> c -> a is one circle, d -> a is not part of it."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
