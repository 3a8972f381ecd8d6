"""The package's import graph (tests/import_graph.py) has no cycles: each module can be read, tested and moved
without the modules that import it."""

from import_graph import PACKAGE_DIR, Import, describe_cycle, import_graph, strongly_connected

def test_no_import_cycles():
    graph = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) + "\n" + describe_cycle(graph, c)
                                                      for c in cycles)


# The package's folders and top-level modules, lowest first: a module imports from its own layer or the ones below,
# never from above (a lazy import counts too: it runs when its function does; so does a module named in a string,
# which some code imports by name).
LAYERS = (
    ("errors", "flags", "atomic_write", "progress", "defaults", "megatron_core_compat", "processes", "install",
     "extras"),
    ("checkpoint",),  # where checkpoints are and what they hold: for data, conversion and training alike
    ("model_source", "kernels"),
    ("hf", "model"),
    ("parallel",),
    ("data",),  # the floor of data's two rooms: tokenizers, the .bin/.idx checks, the tokenizer record
    ("data.preprocessing",),  # offline: corpora to .bin/.idx
    ("data.datasets",),  # training time: .bin/.idx to batches
    ("conversion",),
    ("training", "training.config"),  # training's rooms, lowest first
    ("training.reporting",),
    ("training.resilience",),
    ("training.engine",),
    ("embeddings",),
    ("evaluation",),
    ("cli", "pretrain"),
)


def layer_of(module: str) -> str:
    """The layer of a module: its folder or top-level module, and for training and data, the room it is in."""
    parts = module.split(".")
    return ".".join(parts[1:3]) if parts[1] in ("training", "data") and len(parts) > 3 else parts[1]


def test_no_module_imports_from_a_layer_above_its_own():
    level = {name: depth for depth, names in enumerate(LAYERS) for name in names}
    upward = []
    for importer, imported in import_graph().items():
        for module, imports in imported.items():
            here, there = map(layer_of, (importer, module))
            if level[there] > level[here]:
                upward.append(f"{importer} -> {module} (line {imports[0].line})")
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_the_rooms_of_data_do_not_import_each_other():
    """The offline preprocessing and the training-time datasets share only data's floor: in either direction an
    import between them would be a layer above (datasets -> preprocessing is allowed by the layers, so checked
    here)."""
    across = [f"{importer} -> {module}" for importer, imported in import_graph().items() for module in imported
              if layer_of(importer) == "data.datasets" and layer_of(module) == "data.preprocessing"]
    assert not across, "\n".join(across)


def test_the_graph_follows_relative_lazy_and_submodule_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from . import b\nimport os\n",                  # relative, a submodule by name
        "b.py": "def f():\n    from pkg.sub.c import g\n",       # in a function, a name from a module
        "sub/__init__.py": "from .c import g\n",                  # a package's relative import
        "sub/c.py": "from ..a import x\ng = 1\n",                 # two levels up
        # modules named in strings: a module, a name in one (in a function); the package alone, another package's
        # module and words name none
        "d.py": 'PRELOAD = ["pkg.a"]\ndef f():\n    return "pkg.sub.c.g", "pkg", "pkgx.a", "pkg.a is here"\n',
    }
    for name, text in files.items():
        (package / name).write_text(text)
    graph = import_graph(package)
    assert {m: sorted(t) for m, t in graph.items()} == {
        "pkg": [], "pkg.a": ["pkg.b"], "pkg.b": ["pkg.sub.c"], "pkg.sub": ["pkg.sub.c"], "pkg.sub.c": ["pkg.a"],
        "pkg.d": ["pkg.a", "pkg.sub.c"]}
    assert [imp.lazy for imp in graph["pkg.b"]["pkg.sub.c"]] == [True]
    assert graph["pkg.d"] == {"pkg.a": [Import(1, lazy=False, in_string=True)],
                              "pkg.sub.c": [Import(3, lazy=True, in_string=True)]}
    assert strongly_connected(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert describe_cycle(graph, ["pkg.a", "pkg.b", "pkg.sub.c"], package).splitlines() == [
        "  pkg/a.py:1 imports pkg.b",
        "  pkg/b.py:2 imports pkg.sub.c (in a function)",
        "  pkg/sub/c.py:1 imports pkg.a"]


def test_every_name_imported_from_the_package_exists():
    """Each `from megatron_neobert... import name`, at module level or inside a function, names something the
    module defines: a function-level import of a moved or renamed helper fails only when its function first runs
    (the benchmark's FP8 path, say), so it is checked here for the package, its tools and its tests."""
    import ast
    import importlib

    repo = PACKAGE_DIR.parent
    missing = []
    for path in sorted([*PACKAGE_DIR.rglob("*.py"), *(repo / "tools").glob("*.py"), *(repo / "tests").rglob("*.py")]):
        if path.name.startswith("modular_"):  # the modular converter's source, in transformers' package layout
            continue
        package = list(path.relative_to(repo).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if not module.startswith("megatron_neobert"):
                continue
            imported = importlib.import_module(module)
            for alias in node.names:
                if not hasattr(imported, alias.name):
                    try:
                        importlib.import_module(f"{module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{path.relative_to(repo)}:{node.lineno} {module}.{alias.name}")
    assert not missing, missing


def layers_sentence() -> str:
    """docs/development.md's sentence of the layers, from LAYERS: a folder with a slash, data's and training's rooms
    as their folder (its table row names them)."""
    def name(module: str) -> str:
        return f"`{module}/`" if (PACKAGE_DIR / module).is_dir() else f"`{module}`"

    groups = []
    for layer in LAYERS:
        names = [name(module) for module in layer if not module.startswith(("data.", "training."))]
        if names:
            groups.append(" and ".join(names))
    base, *middle, top = groups
    return (f"The folders are layers, lowest first: the base modules ({base.replace(' and ', ', ')}), "
            f"{', '.join(middle)}, and on top {top}.")


def test_the_development_guide_lists_the_layers_of_the_import_graph():
    guide = " ".join((PACKAGE_DIR.parent / "docs" / "development.md").read_text().split())
    assert layers_sentence() in guide, f"docs/development.md's layers should read:\n{layers_sentence()}"
