r"""Which megatron-core release a container's Transformer Engine (TE) can run, judged by what that TE provides rather
than by a window of its version numbers.

The Dockerfile asks before it installs megatron-core (so nothing here imports torch or megatron-core at module level):

    python -m megatron_neobert.install.te_support --choose /tmp/megatron-core.txt   # MEGATRON_CORE=auto|0.16.1|0.19.2

Each supported release (`releases.RELEASES`) has a list of the TE names its source uses, with the keyword arguments
it passes to them where the source shows them (`Release.te_api`), read statically by `scan_te_api`. After a release
bump a maintainer regenerates the installed release's list:

    python -m megatron_neobert.install.te_support --write
"""

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import json
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from packaging.version import Version

from megatron_neobert.flags import ArgumentParser, add_flags, setting
from megatron_neobert.install.releases import RELEASES

TE = "transformer_engine"
PACKAGE_DIR = Path(__file__).parents[1]  # the project's own layers, whose TE names the lists include
# The megatron-core wrappers of TE layers are imported from this module (the model's layer specs use four of them).
TE_WRAPPERS = "megatron.core.extensions.transformer_engine"


MISSING_SHOWN = 3  # missing names a refusal names; more would not fit its one line


def api_path(release: str) -> Path:
    """The shipped list of TE names of a supported release (`Release.te_api`), by its version."""
    return next(r.te_api for r in RELEASES if r.version == release)


def _is_te(module: str) -> bool:
    return module == TE or module.startswith(TE + ".")


def _chain(node: ast.AST) -> Optional[List[str]]:
    """`a.b.c` as ["a", "b", "c"]; None for anything that is not a name followed by attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception"}
# A failed import of these means no TE at all, not an older one
_TE_ITSELF = {TE, TE + ".pytorch"}
_VERSION_CHECK = "is_te_min_version"  # megatron-core's test of the installed TE's version


def _imports_te_itself(statements: Sequence[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Import) and {a.name for a in n.names} & _TE_ITSELF
               or isinstance(n, ast.ImportFrom) and n.module == TE and any(a.name == "pytorch" for a in n.names)
               for statement in statements for n in ast.walk(statement))


def _optional_nodes(tree: ast.Module) -> set:
    """The nodes whose TE names megatron-core does without: a `try` block with an ImportError handler asks whether
    this TE has a feature (`from transformer_engine.pytorch.attention import _SplitAlongDim`), unless it imports TE or
    its PyTorch package itself, which asks whether TE is installed (`import transformer_engine as te` with
    `HAVE_TE = False` as the handler): what that one imports is needed. Both branches of an `if` on
    `is_te_min_version(...)` are optional too: the TE's version picks one."""
    statements = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            if not _imports_te_itself(node.body) and any(
                    h.type is None or {n.id for n in ast.walk(h.type) if isinstance(n, ast.Name)} & _IMPORT_ERRORS
                    for h in node.handlers):
                statements += node.body
        elif isinstance(node, ast.If) and any(isinstance(n, ast.Call) and _chain(n.func) == [_VERSION_CHECK]
                                              for n in ast.walk(node.test)):
            statements += node.body + node.orelse
    return {id(n) for statement in statements for n in ast.walk(statement)}


class _ModuleScan:
    """The TE names one source file uses, and the keywords it passes to them."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.optional = _optional_nodes(tree)
        self.bound: Dict[str, str] = {}  # a local name -> the TE path it stands for
        self.imported: List[str] = []
        for node in ast.walk(tree):
            if id(node) in self.optional:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_te(alias.name):
                        self.imported.append(alias.name)
                        # `import transformer_engine.pytorch` binds transformer_engine; with `as`, the whole path
                        local = alias.asname or alias.name.split(".")[0]
                        self.bound[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_te(node.module):
                for alias in node.names:
                    self.imported.append(f"{node.module}.{alias.name}")
                    self.bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def resolve(self, node: ast.AST) -> Optional[str]:
        """The TE path an expression such as `te.pytorch.Linear` names, or None."""
        parts = _chain(node)
        if parts is None or parts[0] not in self.bound:
            return None
        return ".".join([self.bound[parts[0]], *parts[1:]])

    def scan(self, within: Optional[ast.AST] = None) -> Dict[str, set]:
        """Chains through TE names, the keywords of calls to them and of `super()` calls in classes derived from
        them, and the file's TE imports; in `within` only (a class, say), else in the whole file."""
        names: Dict[str, set] = {}

        def use(name: str, keywords: Iterable[str] = ()) -> None:
            names.setdefault(name, set()).update(keywords)

        for name in [] if within else self.imported:
            use(name)
        inner = set()  # the attribute nodes inside a longer chain: only the whole chain is a name
        for node in ast.walk(within or self.tree):
            if isinstance(node, ast.Attribute):
                inner.add(id(node.value))
        for node in ast.walk(within or self.tree):
            if id(node) in self.optional:
                continue
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                name = self.resolve(node)
                if name is not None:
                    # `te_mod.Linear.forward = ...` assigns the last attribute: only what it hangs on must exist
                    use(name if isinstance(node.ctx, ast.Load) else name.rsplit(".", 1)[0])
            elif isinstance(node, ast.Call):
                name = self.resolve(node.func)
                if name is not None:
                    use(name, (kw.arg for kw in node.keywords if kw.arg))
            elif isinstance(node, ast.ClassDef):
                for name, keywords in self._super_calls(node):
                    use(name, keywords)
        return names

    def _super_calls(self, cls: ast.ClassDef) -> Iterable[Tuple[str, List[str]]]:
        """`super().__init__(k=...)` in a class derived from a TE class passes `k` to that class; `super().m(k=...)`
        to its method `m`."""
        base = next((name for name in map(self.resolve, cls.bases) if name), None)
        for node in ast.walk(cls) if base else ():
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Call) and _chain(node.func.value.func) == ["super"]):
                method = node.func.attr
                yield base if method == "__init__" else f"{base}.{method}", [kw.arg for kw in node.keywords if kw.arg]


def _parse(path: Path) -> ast.Module:
    with warnings.catch_warnings():  # megatron-core's invalid escapes in docstrings are its own to fix
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(path.read_text(), str(path))


def _as_lists(names: Dict[str, set]) -> Dict[str, List[str]]:
    return {name: sorted(names[name]) for name in sorted(names)}


def scan_te_api(root: Path) -> Dict[str, List[str]]:
    """The TE names the Python files under `root` use ({dotted name: keywords passed to it}), read with `ast`."""
    found: Dict[str, set] = {}
    for path in sorted(Path(root).rglob("*.py")):
        for name, keywords in _ModuleScan(_parse(path)).scan().items():
            found.setdefault(name, set()).update(keywords)
    return _as_lists(found)


def project_te_api(project_root: Path, megatron_core_root: Path) -> Dict[str, List[str]]:
    """The TE names this project reaches: those its own files use, and those in the bodies of the megatron-core TE
    wrappers it imports (its layer specs), and of their bases within megatron-core's module."""
    found = {name: set(keywords) for name, keywords in scan_te_api(project_root).items()}
    wrappers = set()
    for path in sorted(Path(project_root).rglob("*.py")):
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ImportFrom) and node.module == TE_WRAPPERS:
                wrappers.update(alias.name for alias in node.names)
    source = Path(megatron_core_root, *TE_WRAPPERS.split(".")[2:]).with_suffix(".py")
    module = _ModuleScan(_parse(source))
    classes = {node.name: node for node in module.tree.body if isinstance(node, ast.ClassDef)}
    while wrappers:
        cls = classes[wrappers.pop()]
        for name, keywords in module.scan(within=cls).items():
            found.setdefault(name, set()).update(keywords)
        wrappers.update(b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in classes)
    return _as_lists(found)


def shipped_api(release: str) -> Dict[str, List[str]]:
    """What the choice checks of a TE for a supported megatron-core release: every name the release needs (a missing
    one fails its import), and the keywords of the calls this project's layers make. The release's other calls are
    not checked: its features that the model does not use may pass newer keywords (0.19.2's generalized tensor
    parallelism passes `gather_along_first_dim(output_tensor=)`, which TE 2.17.1 lacks)."""
    lists = json.loads(api_path(release).read_text())
    needed = {name: set() for name in lists["megatron_core"]}
    for name, keywords in lists["project"].items():
        needed.setdefault(name, set()).update(keywords)
    return _as_lists(needed)


def te_lacks(name: str, keywords: Sequence[str]) -> List[str]:
    """What this process's TE lacks of `name` (a dotted path) and of the keywords passed to it; [] when nothing."""
    parts = name.split(".")
    found = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], 2):
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        if not inspect.ismodule(found):
            return [name]
        try:  # a submodule that nothing has imported yet
            found = importlib.import_module(".".join(parts[:depth]))
        except ModuleNotFoundError as err:
            if err.name != ".".join(parts[:depth]):
                raise
            return [name]
    if not keywords:
        return []
    try:
        parameters = inspect.signature(found).parameters.values()
    except (TypeError, ValueError):  # a compiled function's signature cannot be read: its keywords go unchecked
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return []
    accepted = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return [f"{name}({keyword}=)" for keyword in keywords if keyword not in accepted]


def choose_megatron_core(te_version: str, python_version: Sequence[int],
                         lacks: Callable[[str, Sequence[str]], List[str]] = te_lacks,
                         requested: str = "auto") -> Tuple[Optional[str], List[str]]:
    """The megatron-core release to install beside TE `te_version` on CPython `python_version` (None when none fits),
    and one line for each release refused, saying why. `lacks(name, keywords)`: what the TE lacks of a name
    (te_lacks reads the importable TE). `requested`: "auto" tries the releases newest first, a release that one
    alone. Versions compare by base release: an NGC build's 2.9.0a0+abc.nv25.11 is 2.9.0, and 2.12.0a0 is not
    below 2.12."""
    candidates = [r for r in RELEASES if requested in ("auto", r.version)]
    if not candidates:
        raise ValueError(f"megatron-core {requested}: auto, or one of {', '.join(r.version for r in RELEASES)}")
    te = Version(Version(te_version).base_version)
    reasons = []
    for release in candidates:
        why = []
        if tuple(python_version[:2]) < release.python[0]:
            why.append(f"needs CPython >={'.'.join(map(str, release.python[0]))}, "
                       f"this is {'.'.join(map(str, python_version[:3]))}")
        if te < Version(release.min_te):
            why.append(f"needs transformer_engine >={release.min_te}")
        if release.te_below and te >= Version(release.te_below):
            why.append(f"declares transformer_engine <{release.te_below}")
        missing = [gap for name, keywords in shipped_api(release.version).items() for gap in lacks(name, keywords)]
        if missing:
            why.append(f"transformer_engine lacks {len(missing)} of what it calls: "
                       + ", ".join(missing[:MISSING_SHOWN]) + (", ..." if len(missing) > MISSING_SHOWN else ""))
        if not why:
            return release.version, reasons
        reasons.append(f"megatron-core {release.version} refused for transformer_engine {te_version}: "
                       + "; ".join(why))
    return None, reasons


def write_api(megatron_core_root: Path, release: str) -> Path:
    """Regenerates the release's shipped list (`Release.te_api`) from the megatron-core source at `megatron_core_root`
    (the installed one), with this project's layers' names on it."""
    path = api_path(release)
    path.write_text(json.dumps({"megatron_core": scan_te_api(megatron_core_root),
                                "project": project_te_api(PACKAGE_DIR, megatron_core_root)},
                               indent=1) + "\n")
    return path


def installed_megatron_core() -> Tuple[str, Path]:
    """The installed megatron-core's base release (0.19.2 for 0.19.2+68be03e) and its source folder."""
    from importlib.metadata import version

    spec = importlib.util.find_spec("megatron.core")  # finds it without running its imports (torch)
    return Version(version("megatron-core")).base_version, Path(spec.origin).parent


@dataclasses.dataclass(frozen=True)
class TeSupportFlags:
    choose: Optional[str] = setting(None, "write the megatron-core release this container's TE and CPython run to "
                                    "this file (the Dockerfile's step); each refused release is one line",
                                    metavar="FILE")
    megatron_core: str = setting("auto", "with --choose: auto (the newest that fits) or the one release to check",
                                 choices=["auto", *(r.version for r in RELEASES)])
    write: bool = setting(False, "regenerate the installed megatron-core release's list of TE names (assets/)")


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m megatron_neobert.install.te_support", description=__doc__)
    add_flags(p, TeSupportFlags)
    args = p.parse_args(argv)
    if args.write:
        release, root = installed_megatron_core()
        if release not in {r.version for r in RELEASES}:
            print(f"error: megatron-core {release} is not in megatron_neobert/install/releases.py", file=sys.stderr)
            return 1
        print(f"megatron-core {release}: {write_api(root, release)}")
    if args.choose:
        from importlib.metadata import PackageNotFoundError, version

        try:
            te = version("transformer-engine")
        except PackageNotFoundError:
            print("error: no Transformer Engine here: use an NGC PyTorch image", file=sys.stderr)
            return 1
        release, reasons = choose_megatron_core(te, sys.version_info, requested=args.megatron_core)
        for line in reasons:
            print(line, file=sys.stderr)
        python = sys.version.split()[0]
        if release is None:
            print(f"error: transformer_engine {te} with CPython {python} runs no supported megatron-core "
                  f"({args.megatron_core}): pick another NGC image (docs/gpu.md)", file=sys.stderr)
            return 1
        Path(args.choose).write_text(release)
        print(f"transformer_engine {te} | CPython {python} -> megatron-core {release}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
