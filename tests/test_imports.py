"""The package's import graph has no circle: every `import` of a lipt module, at module level
or inside a function (a lazy import hides a circle, it does not remove it), is an edge."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = SRC / "lipt") -> dict[str, set[str]]:
    """lipt module -> the lipt modules it imports (anywhere in its body)."""
    files = {module_name(p, root.parent): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x, from .a import b
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from lipt.x import y` imports the module lipt.x.y when there is one
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for target in targets:
                while target and target not in files:  # lipt.a.b.attr -> lipt.a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def planted(tmp_path: Path, modules: dict[str, str]) -> Path:
    """A package `lipt` of the given modules (file name -> source)."""
    pkg = tmp_path / "lipt"
    pkg.mkdir()
    for name, source in modules.items():
        (pkg / name).write_text(source)
    return pkg


def test_the_graph_sees_lazy_imports_and_finds_a_planted_circle(tmp_path):
    pkg = planted(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from lipt.b import f\n",
            "b.py": "def f():\n    from lipt import a\n",
            "c.py": "import lipt.a\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["lipt.a"] == {"lipt.b"} and graph["lipt.b"] == {"lipt.a"}
    assert cycles(graph) == [["lipt.a", "lipt.b"]]


def test_lipt_has_no_import_circle():
    graph = import_graph()
    assert graph.get("lipt.stages.jigsaw")
    assert cycles(graph) == []


def test_the_top_of_the_package_holds_packages_only():
    """src/lipt/ reads as the pipeline: a few packages, no loose modules beside __init__.py."""
    entries = sorted(p.name for p in (SRC / "lipt").iterdir() if p.name != "__pycache__")
    loose = [n for n in entries if (SRC / "lipt" / n).is_file()]
    assert loose == ["__init__.py", "py.typed"], loose
    # one folder per layer (LAYERS below) and nothing else
    assert sorted(set(entries) - set(loose)) == sorted(name for names in LAYERS for name in names)


# One layer per folder of src/lipt/, from the bottom (docs/DESIGN.md, "Layers"): a folder
# imports only folders of a lower layer. core, the foundation, imports nothing else of lipt; run,
# the entry layer, is imported by nothing. The package's own __init__ (the Python API) is on top.
LAYERS = (
    ("core",),
    ("data", "models"),
    ("selection",),
    ("jigsaw", "dynamic", "report", "cleaning"),
    ("budget", "warmup"),
    ("stages",),
    ("run",),
)


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each folder of lipt as one node: folder -> the other folders its modules import."""

    def folder(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in packages) else None

    packages = {p.name for p in (SRC / "lipt").iterdir() if p.is_dir() and p.name != "__pycache__"}
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = folder(module)
        if source is None:
            continue
        folders.setdefault(source, set())
        folders[source] |= {t for t in map(folder, targets) if t is not None and t != source}
    return folders


def imports_not_downward(
    folders: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]
) -> list[tuple[str, str]]:
    """(folder, imported folder) pairs where the import does not go to a lower layer."""
    level = {name: i for i, names in enumerate(layers) for name in names}
    return sorted((a, b) for a, bs in folders.items() for b in bs if level[b] >= level[a])


def test_the_folders_are_layered_and_each_imports_only_lower_ones():
    folders = folder_graph(import_graph())
    assert set(folders) == {name for names in LAYERS for name in names}, sorted(folders)
    assert imports_not_downward(folders, LAYERS) == []
    assert folders["core"] == set() and not any("run" in bs for bs in folders.values())
    # the check sees an import that runs back up, and one across a layer
    planted = {"core": {"data"}, "data": {"models"}, "models": set()}
    assert imports_not_downward(planted, (("core",), ("data", "models"))) == [
        ("core", "data"),
        ("data", "models"),
    ]


# The foundation (lipt.core) and the pure rooms above it: these import, of lipt, only one
# another, never a stage (nor its builder), the config checks or a report.
PURE_PACKAGES = ("lipt.data", "lipt.models", "lipt.selection")
PURE_MODULES = {"lipt.dynamic.plan"} | {
    f"lipt.jigsaw.{m}" for m in ("soup", "weights", "pruning", "shards")
}


def test_the_pure_rooms_and_the_foundation_import_nothing_above_them():
    graph = import_graph()
    core = {name for name in graph if name.startswith("lipt.core.")}
    assert {"lipt.core.errors", "lipt.core.settings", "lipt.core.console", "lipt.core.job"} <= core
    pure = {
        name
        for name in graph
        if name in PURE_MODULES or any(name == p or name.startswith(p + ".") for p in PURE_PACKAGES)
    }
    assert pure >= PURE_MODULES
    allowed = pure | core | {"lipt.jigsaw", "lipt.core"}  # package __init__s of docstrings only
    for name in sorted(pure | core):
        above = graph[name] - allowed
        assert not above, f"{name} imports {sorted(above)}"


# The entry layer: the modules that read the composed config (omegaconf's DictConfig) and turn
# it into the run's typed settings (lipt.run.config.validate -> lipt.stages.run.Run) or check
# it. Everything else, the stages (their builder included) takes the typed settings.
ENTRY_LAYER = {
    f"lipt.run.{m}"
    for m in (
        "cli",
        "hydra_flags",
        "precheck",
        "composition",
        "declared_sweep",
        "sweep_overrides",
        "approach_pins",
        "sweep_settings",
        "config",
        "preflight",
        "groups",
        "rules",
        "config_doc",
        "hydra_callbacks",
        "frontier_sweep",
        "slurm",
        "slurm_launcher",
        "slurm_pending",
        "slurm_learners",
    )
}


def importers_of(library: str, root: Path = SRC / "lipt") -> set[str]:
    """The lipt modules that import `library`, at module level or inside a function."""
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n == library or n.startswith(library + ".") for n in names):
                found.add(module_name(path, root.parent))
    return found


def test_importers_of_sees_lazy_imports(tmp_path):
    lazy = "def f():\n    from omegaconf.errors import MissingMandatoryValue\n"
    pkg = planted(tmp_path, {"a.py": lazy, "b.py": "import omegaconfig\n"})
    assert importers_of("omegaconf", pkg) == {"lipt.a"}


def test_only_the_entry_layer_reads_the_composed_config():
    importers = importers_of("omegaconf")
    assert "lipt.run.config" in importers
    assert importers <= ENTRY_LAYER, sorted(importers - ENTRY_LAYER)


def test_the_stages_take_the_typed_settings():
    """Each entry script's stage is called with lipt.stages.run.Run, built by the entry layer."""
    import inspect

    from lipt.stages import pretrain, select, train

    for stage in (pretrain, select, train):
        (parameter,) = inspect.signature(stage.run).parameters.values()
        assert parameter.annotation == "Run", stage.__name__
