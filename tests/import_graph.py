"""The import graph of megatron_neobert, read from the source with ``ast`` (nothing is imported), and its cycles.

    python tests/import_graph.py            # the cycles, each with the import lines that close it
    python tests/import_graph.py --edges    # every edge: importer -> imported (line, and whether lazy)

Every ``import`` counts, at module level or inside a function (a function-level import only hides a cycle until
the function runs), and so does a module's name written in a string ("megatron_neobert.x.y", or a name in it:
"megatron_neobert.x.y.f"), which some code imports by name (importlib, a list of modules to preload). An edge goes
to the module named, not to the packages above it: Python initializes a module's parent packages before the module,
so those edges never close a cycle on their own.
"""

import argparse
import ast
import dataclasses
import re
from pathlib import Path
from typing import Dict, List, Optional, Set

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "megatron_neobert"


@dataclasses.dataclass(frozen=True)
class Import:
    line: int
    lazy: bool  # inside a function, so it runs on the first call rather than at import time
    in_string: bool = False  # a module's name in a string, imported by name rather than by an import statement


Graph = Dict[str, Dict[str, List[Import]]]  # importer -> {imported module -> the statements importing it}


def module_names(package_dir: Path = PACKAGE_DIR) -> Dict[str, Path]:
    """Dotted module name -> source file, for every .py file of the package (a package by its __init__.py)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported_modules(node: ast.AST, module: str, is_package: bool, modules: Dict[str, Path]) -> List[str]:
    """The package modules an import statement loads: ``from X import y`` loads the submodule X.y when there is
    one, else takes the name y from X."""
    if isinstance(node, ast.Import):
        return [name for name in dict.fromkeys(alias.name for alias in node.names) if name in modules]
    if node.level:  # relative: one level is the importer's own package
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module
    named = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    return [name for name in dict.fromkeys(named) if name in modules]


def _module_named_in(text: str, modules: Dict[str, Path]) -> Optional[str]:
    """The package module a string names, itself or by a name in it ("pkg.a.b.f": pkg.a.b); None for a string that
    names none, or only the package (a logger's name)."""
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text):
        return None
    parts = text.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 1, -1) if ".".join(parts[:n]) in modules), None)


def _lazy_nodes(tree: ast.Module) -> Set[int]:
    """ids of the nodes inside a function body (at any depth)."""
    return {id(inner) for outer in ast.walk(tree) if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef))
            for inner in ast.walk(outer)}


def import_graph(package_dir: Path = PACKAGE_DIR) -> Graph:
    """importer -> {imported module -> the statements importing it, in line order}, package modules only."""
    modules = module_names(package_dir)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        lazy = _lazy_nodes(tree)
        edges = graph.setdefault(module, {})
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names, in_string = _imported_modules(node, module, path.name == "__init__.py", modules), False
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names, in_string = [name for name in [_module_named_in(node.value, modules)] if name], True
            else:
                continue
            for name in names:
                if name != module:
                    edges.setdefault(name, []).append(Import(node.lineno, id(node) in lazy, in_string))
        for imports in edges.values():
            imports.sort(key=lambda imp: imp.line)
    return graph


def strongly_connected(graph: Graph) -> List[List[str]]:
    """The graph's cycles as strongly connected components of two or more modules (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def describe_cycle(graph: Graph, component: List[str], package_dir: Path = PACKAGE_DIR) -> str:
    """One line per import inside the component: where it is and what it imports."""
    files = module_names(package_dir)
    lines = []
    for importer in component:
        where = files[importer].relative_to(package_dir.parent)
        for target, imports in sorted(graph[importer].items()):
            if target in component:
                lines += [f"  {where}:{imp.line} {_how(imp)} {target}{' (in a function)' if imp.lazy else ''}"
                          for imp in imports]
    return "\n".join(lines)


def _how(imp: Import) -> str:
    return "names in a string" if imp.in_string else "imports"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", action="store_true", help="print every edge of the graph, not only the cycles")
    args = parser.parse_args()
    graph = import_graph()
    if args.edges:
        for importer in sorted(graph):
            for target, imports in sorted(graph[importer].items()):
                lines = ", ".join(f"{imp.line}{' in a function' if imp.lazy else ''}"
                                  f"{' in a string' if imp.in_string else ''}" for imp in imports)
                print(f"{importer} -> {target}  (line {lines})")
    components = strongly_connected(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} edges, {len(components)} cycles")
    for component in components:
        print(" <-> ".join(component))
        print(describe_cycle(graph, component))


if __name__ == "__main__":
    main()
