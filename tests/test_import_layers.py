"""The engine's packages import one way (docs/ARCHITECTURE.md, "The engine's packages").

    top (engine, families, ...) -> models -> fused -> quants -> jit,   and anyone -> plain parts

Read from the sources with ``ast``, nothing imported: a module may import modules of its own
layer or of a layer below, never above; the plain parts (gguf_file, tokenizer, kv_cache, ...)
import only plain parts. No module of the engine imports Django or the rest of ``inference``,
no import inside a function (or under ``if TYPE_CHECKING``) reaches back into the engine (the
way a circle is usually hidden), and the module-level imports form no circle.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = "inference.engine"

# Layers, from the top: a module imports its own layer or one further down this list.
TOP, MODELS, FUSED, QUANTS, JIT, PLAIN = range(6)
LAYER_NAMES = ("top", "models", "fused", "quants", "jit", "plain")
PACKAGES = {
    "models": MODELS,
    "fused": FUSED,
    "quants": QUANTS,
    "jit": JIT,
    "training": TOP,  # the cartridge forward and backward, over a loaded model
    "tokenizer": PLAIN,
}
# The top: what assembles a model from the layers below (and the package itself, whose import
# installs jit's cache locator).
TOP_MODULES = {"__init__", "engine", "families", "diffusion_sampler", "nanochat_checkpoint"}
# The plain parts: no kernels, no model; anyone may import them.
PLAIN_MODULES = {
    "chat_template",
    "embedding",
    "fingerprint",
    "gguf_file",
    "gguf_strings",
    "heap",
    "kv_cache",
    "kv_geometry",
    "load_options",
    "logprobs",
    "prefix",
    "sampler",
}
# Imports of engine modules inside a function or under ``if TYPE_CHECKING`` that are allowed,
# as {(importer, imported): why}. None is needed today: keep it that way.
DEFERRED_ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    deferred: bool  # inside a function, or only for type checkers


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path = ROOT) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _deferred_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a function or an ``if TYPE_CHECKING:`` block."""
    deferred = set()
    for node in ast.walk(tree):
        in_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        type_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if in_function or type_only:
            deferred.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return deferred


def imports_of(path: Path, root: Path = ROOT) -> list[Edge]:
    """Every import in ``path`` (a file under ``root``), each imported module named in full
    (``from pkg import mod`` names pkg.mod; ``from pkg import name`` names pkg)."""
    tree = ast.parse(path.read_text())
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deferred = _deferred_nodes(tree)
    edges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            submodules = [f"{target}.{alias.name}" for alias in node.names]
            targets = [s if is_module(s, root) else target for s in submodules]
        else:
            continue
        for target in dict.fromkeys(targets):
            edges.append(Edge(name, target, node.lineno, id(node) in deferred))
    return edges


def engine_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "inference" / "engine").rglob("*.py"))


def layer_of(module: str) -> int:
    """The layer of an engine module; KeyError for one no layer claims (place it first)."""
    parts = module.split(".")[2:] or ["__init__"]
    if parts[0] in PACKAGES:
        return PACKAGES[parts[0]]
    if len(parts) == 1 and parts[0] in TOP_MODULES:
        return TOP
    if len(parts) == 1 and parts[0] in PLAIN_MODULES:
        return PLAIN
    raise KeyError(f"{module} belongs to no layer: add it to tests/test_import_layers.py and the docs")


def in_engine(module: str) -> bool:
    return module == ENGINE or module.startswith(ENGINE + ".")


def outside_imports(edges: list[Edge]) -> list[str]:
    """Imports of Django, or of the project outside the engine, by engine modules."""
    project = {"inference", "api", "fleet", "lmserve_site", "bench", "scripts"}
    return [
        f"{e.importer}:{e.line} imports {e.imported}"
        for e in edges
        if in_engine(e.importer)
        and (
            e.imported.split(".")[0] == "django"
            or (e.imported.split(".")[0] in project and not in_engine(e.imported))
        )
    ]


def layer_violations(edges: list[Edge]) -> list[str]:
    """Imports from a layer to a layer above it; plain parts importing anything but plain."""
    found = []
    for e in edges:
        if not (in_engine(e.importer) and in_engine(e.imported)) or e.imported == ENGINE:
            continue
        upper, lower = layer_of(e.importer), layer_of(e.imported)
        wrong = (upper == PLAIN and lower != PLAIN) or (upper != PLAIN and lower < upper)
        if wrong:
            found.append(
                f"{e.importer}:{e.line} ({LAYER_NAMES[upper]}) imports {e.imported} ({LAYER_NAMES[lower]})"
            )
    return found


def cycles(edges: list[Edge], scope: str = ENGINE) -> list[list[str]]:
    """The circles of module-level imports among the modules under ``scope`` (strongly
    connected components of more than one module, or a module importing itself)."""

    def inside(module: str) -> bool:
        return module == scope or module.startswith(scope + ".")

    graph: dict[str, set[str]] = {}
    for e in edges:
        if inside(e.importer) and inside(e.imported) and not e.deferred:
            graph.setdefault(e.importer, set()).add(e.imported)
            graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return [e for path in engine_files() for e in imports_of(path)]


def test_every_engine_module_belongs_to_a_layer():
    for path in engine_files():
        layer_of(module_name(path))


def test_the_engine_imports_no_django_and_nothing_else_of_the_project(edges):
    assert outside_imports(edges) == []


def test_engine_imports_point_down(edges):
    assert layer_violations(edges) == []


def test_no_engine_import_is_deferred_to_hide_a_circle(edges):
    deferred = [
        f"{e.importer}:{e.line} imports {e.imported} inside a function or for type checkers only"
        for e in edges
        if e.deferred and in_engine(e.imported) and (e.importer, e.imported) not in DEFERRED_ALLOWED
    ]
    assert deferred == []


def test_engine_module_imports_form_no_circle(edges):
    assert cycles(edges) == []


def test_the_request_types_point_down_and_inference_has_no_circle():
    # inference/types.py is what the dialects and the generation loops share: it sits below
    # both (it imported generation/ once, for three dataclasses that now live in it).
    edges = [e for path in sorted((ROOT / "inference").rglob("*.py")) for e in imports_of(path)]
    types_imports = {e.imported for e in edges if e.importer == "inference.types"}
    assert {m for m in types_imports if m.startswith("inference.") and not in_engine(m)} == set()
    assert cycles(edges, "inference") == []


# The Django apps import one way: api (the wire) and fleet (cartridges, fleets) over inference
# (the worker), never back, and not each other: the server reaches a fleet through
# settings.LMSERVE_PREFIX_SOURCES, and starts daphne from api's own ``lmserve`` command.
APPS_BELOW = {"api": {"inference"}, "fleet": {"inference"}, "inference": set()}


def app_violations(edges: list[Edge]) -> list[str]:
    """Imports, deferred ones included, from one app to another it may not import."""
    found = []
    for e in edges:
        importer, imported = e.importer.split(".")[0], e.imported.split(".")[0]
        if importer in APPS_BELOW and imported in APPS_BELOW and imported != importer:
            if imported not in APPS_BELOW[importer]:
                found.append(f"{e.importer}:{e.line} imports {e.imported}")
    return found


def test_the_apps_import_one_way():
    edges = [e for app in APPS_BELOW for path in sorted((ROOT / app).rglob("*.py")) for e in imports_of(path)]
    assert app_violations(edges) == []


# -- the checks themselves catch what they are for ------------------------------------------


def _edges_of(tmp_path: Path, files: dict[str, str]) -> list[Edge]:
    """The imports of throwaway modules under ``tmp_path`` (parsed, never imported)."""
    for relative, source in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return [e for relative in files for e in imports_of(tmp_path / relative, tmp_path)]


def test_an_upward_import_a_plain_part_importing_a_kernel_and_a_hidden_circle_are_caught(tmp_path):
    files = {
        "inference/engine/__init__.py": "",
        "inference/engine/quants/__init__.py": "",
        "inference/engine/quants/intdot.py": "from ..fused import step_kernels\n",  # up: quants -> fused
        "inference/engine/fused/__init__.py": "",
        "inference/engine/fused/step_kernels.py": "from ..quants import intdot\n",
        "inference/engine/kv_cache.py": "from .jit.simd import HOST\n",  # plain -> jit
        "inference/engine/jit/__init__.py": "",
        "inference/engine/jit/simd.py": "",
        "inference/engine/jit/stage_calls.py": "def f():\n    from . import compile_split\n",
        "inference/engine/jit/compile_split.py": "from . import stage_calls\n",
        "inference/engine/models/__init__.py": "",
        "inference/engine/models/llama.py": "import django\nfrom ..fused import step_kernels\n",
    }
    edges = _edges_of(tmp_path, files)
    assert sorted(layer_violations(edges)) == [
        "inference.engine.kv_cache:1 (plain) imports inference.engine.jit.simd (jit)",
        "inference.engine.quants.intdot:1 (quants) imports inference.engine.fused.step_kernels (fused)",
    ]
    assert cycles(edges) == [["inference.engine.fused.step_kernels", "inference.engine.quants.intdot"]]
    hidden = [e for e in edges if e.deferred]
    assert [(e.importer, e.imported) for e in hidden] == [
        ("inference.engine.jit.stage_calls", "inference.engine.jit.compile_split")
    ]
    assert outside_imports(edges) == ["inference.engine.models.llama:1 imports django"]


@pytest.mark.parametrize("app", ["api", "fleet", "inference"])
def test_no_app_hides_a_circle_behind_a_deferred_import(app):
    # A function-level import is fine for start-up cost (the worker loads the engine late);
    # it must not be what keeps two modules from importing each other.
    edges = [e for path in sorted((ROOT / app).rglob("*.py")) for e in imports_of(path)]
    assert cycles([dataclasses.replace(e, deferred=False) for e in edges], app) == []
