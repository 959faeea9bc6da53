"""No import circles inside ptdp_jax: every `import` of a ptdp_jax module, at
module level or inside a function, is an edge; the graph has no cycle. (A package's
__init__ that only re-exports is a facade: `from ptdp_jax import metrics` is an edge to
ptdp_jax.metrics, not to ptdp_jax/__init__.py.)"""
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
    assert "ptdp_jax.state" in graph and "ptdp_jax.step" in graph["ptdp_jax.train"]
    assert [c for c in cycles(graph) if c not in KNOWN] == []


def test_the_broken_circles_stay_broken():
    g = import_graph()
    assert "ptdp_jax.step" not in g["ptdp_jax.pipeline.executor"]
    assert "ptdp_jax.distributed" not in g["ptdp_jax.watchdog"]
    assert "ptdp_jax.data.prepare" not in g["ptdp_jax.data.dataset"]


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
