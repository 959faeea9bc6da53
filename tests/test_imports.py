"""No import circles inside ptdp_jax: every `import` of a ptdp_jax module, at
module level or inside a function, is an edge; the graph has no cycle. (A package's
__init__ that only re-exports is a facade: `from ptdp_jax import metrics` is an edge to
ptdp_jax.training.metrics, not to ptdp_jax/__init__.py.)"""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ptdp_jax"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:                 # a submodule, or a name in base
                    full = f"{base}.{a.name}"
                    targets.append(full if full in modules else base)
            for t in targets:
                while t and t not in modules:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


KNOWN: list = []      # every circle fails


def test_no_import_circles():
    graph = import_graph()
    assert "ptdp_jax.training.state" in graph and "ptdp_jax.training.step" in graph["ptdp_jax.run.loop"]
    assert [c for c in cycles(graph) if c not in KNOWN] == []


def test_the_broken_circles_stay_broken():
    g = import_graph()
    assert "ptdp_jax.training.step" not in g["ptdp_jax.pipeline.executor"]
    assert "ptdp_jax.parallel.distributed" not in g["ptdp_jax.parallel.watchdog"]
    assert "ptdp_jax.data.prepare" not in g["ptdp_jax.data.dataset"]


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


# The layers, lowest first: a module may import its own layer and those below it, never one
# above (each folder's __init__ says what it owns). The package's own __init__ is the facade.
LAYERS = ["exits", "paths", "command", "data", "config", "parallel", "models", "pipeline",
          "training", "checkpoint", "plan", "run", "interop", "cli"]


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else None


def upward_imports(graph) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in graph.items() for t in ts
                  if layer_of(m) is not None and layer_of(t) is not None
                  and layer_of(t) > layer_of(m))


def test_no_layer_imports_a_higher_one():
    graph = import_graph()
    assert all(layer_of(m) is not None for m in graph if m != "ptdp_jax"), \
        [m for m in graph if m != "ptdp_jax" and layer_of(m) is None]
    assert upward_imports(graph) == []


def test_at_most_eight_modules_at_the_top():
    top = [p.name for p in PKG.glob("*.py")]
    assert len(top) <= 8, top


def test_the_layer_check_finds_an_upward_import():
    assert upward_imports({"ptdp_jax.models.gpt": {"ptdp_jax.run.loop"}}) == [
        ("ptdp_jax.models.gpt", "ptdp_jax.run.loop")]
