"""The project's imports: the layer contract (import-linter, in pyproject.toml) holds and
catches an upward import; no module cycle; what the contract cannot say is checked here.

The contract states the layers, one way: the CLI -> the driver -> jobs/ (its entries -> the
node runtime) -> the pure core (config, plan, spec, validate, results) -> connector; the
driver imports only the job entries; analysis reads pdbench.results and connector.layout.
A new module belongs to the layer of its folder.

Here, besides: every module of pdbench/, jobs/, connector/ and analysis/ is parsed with
``ast`` (imports at module level or inside a function): the graph has no cycle; an import
inside a function only defers a heavy or optional third-party package and says why on its
line (``import torch  # lazy: <why>``), or is a job entry's one import of the node runtime
(``# lazy: node runtime, loaded on the allocation only``); connector's vLLM plugin and its
transfer bench share only leaf modules; importing the CLI loads no node-runtime module.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pdbench", "jobs", "connector", "analysis", "records", "testbed")

# The vLLM plugin side of connector/ (loaded by vLLM inside the servers) and the transfer
# bench side (run by jobs/entry/transfer_bench.py) share only these leaf modules.
PLUGIN = {
    "connector.plugin.vllm_plugin",
    "connector.plugin.tracing",
    "connector.plugin.transfer_trace",
    "connector.plugin.request_timing",
    "connector.plugin.core_binding",
    "connector.plugin.nixl_progress",
    "connector.plugin.engine_idle",
    "connector.plugin.engine_start",
    "connector.plugin.kv_params_service",
    "connector.plugin.no_lease",
    "connector.plugin.device_clock",
    "connector.plugin.nic_pinning",
}
CONNECTOR_SHARED = {
    "connector.layout",
    "connector.shared_files",
    "connector.process_env",
    "connector.parent_death",
}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported project module (or package)
    line: int
    in_function: bool
    lazy_reason: bool  # "# lazy:" on the statement's lines
    third_party: bool
    text: str = ""  # the statement's lines


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` refers to (a module, or its package), else None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import | ast.ImportFrom):
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                else:
                    base = child.module or ""
                    if child.level:
                        anchor = package.split(".")
                        anchor = anchor[: len(anchor) - (child.level - 1)]
                        base = ".".join([*anchor, base] if base else anchor)
                    names = [f"{base}.{a.name}" for a in child.names] or [base]
                text = "\n".join(lines[child.lineno - 1 : child.end_lineno])
                lazy = "# lazy:" in text
                for name in names:
                    target = _resolve(name, modules)
                    found.append(
                        Import(
                            source=module,
                            target=target or name,
                            line=child.lineno,
                            in_function=in_function,
                            lazy_reason=lazy,
                            third_party=target is None,
                            text=text,
                        )
                    )
            visit(child, inside)

    visit(tree, False)
    return found


def project_imports() -> list[Import]:
    modules = all_modules()
    out = []
    for module, path in modules.items():
        out += imports_of(module, path, modules)
    return out


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a self-import), each as a
    closed path through the component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strongconnect(w)
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
            if len(component) > 1 or v in edges.get(v, ()):
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return [_cycle_path(c, edges) for c in components]


def _cycle_path(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A closed path a -> ... -> a through one strongly connected component."""
    members = set(component)
    start = component[0]
    # breadth-first from start's successors back to start, inside the component
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ()) & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return [*component, component[0]]


def graph(imports: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if not imp.third_party and imp.target != imp.source:
            edges.setdefault(imp.source, set()).add(imp.target)
    return edges


def test_project_imports_form_a_dag():
    cycles = find_cycles(graph(project_imports()))
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_connector_keeps_the_plugin_and_the_bench_apart():
    bad = []
    for imp in project_imports():
        if not imp.source.startswith("connector.") or imp.third_party:
            continue
        if imp.target in CONNECTOR_SHARED or not imp.target.startswith("connector"):
            continue  # the shared leaves, and records (the leaf both write records with)
        if (imp.source in PLUGIN) != (imp.target in PLUGIN):
            bad.append(f"{imp.source}:{imp.line} imports {imp.target}")
    assert bad == [], "plugin <-> bench imports inside connector/:\n" + "\n".join(bad)


ENTRY_LAZY = "# lazy: node runtime, loaded on the allocation only"


def node_runtime(module: str) -> bool:
    """A module of jobs/ other than the package and its entries: runs on the nodes only."""
    return (
        module.split(".")[0] == "jobs"
        and module not in ("jobs", "jobs.entry")
        and (not module.startswith("jobs.entry."))
    )


def entry_runtime_import(imp: Import) -> bool:
    """A job entry's one import of the node runtime, inside the function that runs it."""
    return (
        imp.source.startswith("jobs.entry.")
        and imp.target.startswith(("jobs.", "connector.bench."))
        and not imp.target.startswith("jobs.entry")
        and ENTRY_LAZY in imp.text
    )


def test_imports_inside_functions_are_lazy_third_party_ones_with_a_reason():
    bad = []
    for imp in project_imports():
        if not imp.in_function:
            continue
        if entry_runtime_import(imp):
            continue
        if not imp.third_party:
            bad.append(f"{imp.source}:{imp.line} imports project module {imp.target} in a function")
        elif not imp.lazy_reason:
            bad.append(
                f"{imp.source}:{imp.line} imports {imp.target} in a function without '# lazy:'"
            )
    assert bad == [], "\n".join(bad)


def test_the_checker_finds_a_cycle_and_names_it():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(edges) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_parser_sees_function_level_and_relative_imports(tmp_path):
    modules = {"pkg": tmp_path / "__init__.py", "pkg.a": tmp_path / "a.py", "pkg.b": tmp_path}
    path = tmp_path / "a.py"
    path.write_text(
        "from . import b\ndef f():\n    import torch  # lazy: heavy\n    from pkg.b import x\n"
    )
    found = imports_of("pkg.a", path, modules)
    assert [(i.target, i.in_function, i.lazy_reason, i.third_party) for i in found] == [
        ("pkg.b", False, False, False),
        ("torch", True, True, True),
        ("pkg.b", True, False, False),
    ]


def test_the_node_runtime_is_jobs_but_its_entries():
    assert node_runtime("jobs.run.task") and node_runtime("jobs.workload")
    assert not node_runtime("jobs.entry.deployment") and not node_runtime("jobs")


def test_only_a_job_entry_may_load_the_node_runtime_in_a_function():
    entry = Import(
        "jobs.entry.x",
        "jobs.run.task",
        3,
        True,
        True,
        False,
        f"from jobs.run import task  {ENTRY_LAZY}",
    )
    assert entry_runtime_import(entry)
    assert not entry_runtime_import(
        Import("pdbench.driver.launch", "jobs.run.task", 3, True, True, False, entry.text)
    )
    assert not entry_runtime_import(
        Import("jobs.entry.x", "jobs.run.task", 3, True, True, False, "# lazy: why")
    )


def test_importing_the_deployment_job_entry_loads_no_node_runtime_module():
    """What the driver imports to submit a Deployment: the node runtime stays on the nodes."""
    loaded = loaded_by("import jobs.entry.deployment")
    assert [m for m in loaded if node_runtime(m)] == []


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's contracts of ``root``'s pyproject.toml over ``root``'s packages."""
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_layer_contract_holds():
    out = lint_imports(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    """The packages and pyproject.toml in a temp dir, to plant imports in."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_contract_fails_on_an_upward_import(tree_copy):
    planted = tree_copy / "pdbench" / "plan" / "lengths.py"
    original = planted.read_text()
    planted.write_text(original + "\nimport pdbench.driver.launch  # planted\n")
    try:
        out = lint_imports(tree_copy)
    finally:
        planted.write_text(original)
    assert out.returncode != 0
    assert (
        "layers: CLI -> driver -> jobs -> pure core (validate, spec, plan, results, " in out.stdout
    )
    assert "pdbench.plan.lengths -> pdbench.driver.launch" in out.stdout


def test_the_contract_fails_on_a_node_runtime_import_in_the_driver_and_an_unplaced_job(
    tree_copy,
):
    planted = tree_copy / "pdbench" / "driver" / "status.py"
    original = planted.read_text()
    planted.write_text(original + "\nimport jobs.workload  # planted\n")
    new_module = tree_copy / "jobs" / "helper.py"
    new_module.write_text('"""A module in no layer of jobs/."""\n')
    try:
        out = lint_imports(tree_copy)
    finally:
        planted.write_text(original)
        new_module.unlink()
    assert out.returncode != 0
    assert "the driver imports only the job entries of jobs/ BROKEN" in out.stdout
    assert "pdbench.driver.status -> jobs.workload" in out.stdout
    assert "jobs.helper" in out.stdout  # exhaustive: every module of jobs/ in a layer


def lint_with(tree: Path, module: str, imported: str) -> subprocess.CompletedProcess:
    """The contracts' verdict on ``tree`` with ``import imported`` planted in ``module``
    (a path under the tree), the module restored after."""
    planted = tree / module
    original = planted.read_text()
    planted.write_text(original + f"\nimport {imported}  # planted\n")
    try:
        return lint_imports(tree)
    finally:
        planted.write_text(original)


@pytest.mark.parametrize(
    ("module", "imported", "contract"),
    [
        # validate -> spec -> plan -> results -> traffic -> config: results may not import plan
        ("pdbench/results/jsonable.py", "pdbench.plan.points", "layers: CLI -> driver"),
        (
            "connector/plugin/tracing.py",
            "connector.bench.kv_buffer",
            "connector: the vLLM plugin and the transfer bench apart",
        ),
    ],
)
def test_a_planted_back_edge_breaks_its_contract(tree_copy, module, imported, contract):
    out = lint_with(tree_copy, module, imported)
    assert out.returncode != 0
    assert contract in out.stdout
    source = module.removesuffix(".py").replace("/", ".")
    assert f"{source} -> {imported}" in out.stdout


def loaded_by(statement: str, package: str = "jobs") -> list[str]:
    """The project's modules under ``package`` a fresh interpreter holds after ``statement``."""
    code = (
        f"import sys; {statement}; print(' '.join(sorted(m for m in sys.modules "
        f"if m == {package!r} or m.startswith({package + '.'!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_cli_loads_no_node_runtime_module():
    loaded = loaded_by("import pdbench.cli")
    assert loaded, "the CLI imports the job entries"
    assert [m for m in loaded if node_runtime(m)] == []


def test_the_cli_loads_neither_the_vllm_plugin_nor_the_bench_runtime():
    loaded = loaded_by("import pdbench.cli", "connector")
    assert "connector.layout" in loaded  # the leaves it does use
    assert [m for m in loaded if m.startswith(("connector.plugin", "connector.bench."))] == []
    assert "connector.bench" not in loaded


def test_benchmarks_import_neither_the_tests_nor_a_mock():
    found = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            words = line.strip()
            if words.startswith(("from tests", "import tests")) or "unittest" in words:
                found.append(f"{path.name}:{number}: {words}")
    assert found == [], "benchmarks share code through testbed/, not tests/ or mocks"
