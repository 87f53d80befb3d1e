"""The packages' layers, and imports that still name something after a move (read from source, no import).

Everything sits under one package, sourcegate/. sourcegate/artifact_io/ (atomic artifact files) is the bottom;
sourcegate/evals/ (plain data in, plain data out) sits on it;
sourcegate/pipelines/ (steps, backends, CLI) sits on both. Inside sourcegate/pipelines/ the rooms are layered too (PIPELINE_LAYERS,
bottom first): the foundation (config, Parquet batches, fault points, packaged models) and a version's records
(sourcegate/pipelines/versions: manifest, stamps, promotions log, object store, lock holders); building a version; the search
backends; retrieval and answering; release policy over versions (sourcegate/pipelines/release: verdict, decision, runs, lock);
training answer models (sourcegate/pipelines/training); the application. A lower layer never imports a higher one, not
even inside a function, so an evaluation never reaches up into the pipeline it judges and a backend never
reaches into gate policy. sourcegate/dags/ (the Airflow DAGs' wiring) and sourcegate/plugins/ (the reports plugin) sit on top: nothing
below imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sourcegate", "benchmarks", "dags", "plugins", "tests")  # first-party top-level names
# bottom first; the DAGs' wiring and the Airflow plugin on top
LIBRARY = (
    "sourcegate.artifact_io",
    "sourcegate.evals",
    "sourcegate.pipelines",
    "sourcegate.dags",
    "sourcegate.plugins",
)
# A lower layer and the library packages it may import (besides itself).
MAY_IMPORT = {
    "sourcegate.artifact_io": set(),
    "sourcegate.evals": {"sourcegate.artifact_io"},
    "sourcegate.pipelines": {"sourcegate.artifact_io", "sourcegate.evals"},
}
PIPELINES = ROOT / "sourcegate" / "pipelines"
PIPELINE_LAYERS = [  # each room (folder) in exactly one layer: a folder is a layer
    [
        "sourcegate.pipelines.config",
        "sourcegate.pipelines.batches",
        "sourcegate.pipelines.faults",
        "sourcegate.pipelines.models",
        "sourcegate.pipelines.versions",
        "sourcegate.pipelines.home",
    ],
    ["sourcegate.pipelines.build"],
    ["sourcegate.pipelines.search"],
    ["sourcegate.pipelines.retrieval"],
    ["sourcegate.pipelines.release"],
    ["sourcegate.pipelines.training"],
    ["sourcegate.pipelines.app"],
]


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) for every absolute import in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def first_party_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def folder(package: str) -> Path:
    return ROOT.joinpath(*package.split("."))


def library_package(module: str) -> str | None:
    """The LIBRARY package a module is in (`sourcegate.pipelines.app.cli` -> `sourcegate.pipelines`), else None."""
    return next((p for p in LIBRARY if module == p or module.startswith(p + ".")), None)


def module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(path: Path) -> set[str] | None:
    """Names a module defines or imports at top level (None: a star import, so any name may exist)."""
    names: set[str] = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any(alias.name == "*" for alias in node.names):
                return None
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            body += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            body += [s for h in getattr(node, "handlers", []) for s in h.body]
    return names


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_lower_layer_imports_nothing_above_it(package):
    allowed = MAY_IMPORT[package] | {package}
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted(folder(package).rglob("*.py"))
        for line, module, _ in imports(path)
        if module.split(".")[0] in PACKAGES and library_package(module) not in allowed
    ]
    assert not upward, f"{package}/ may import only {sorted(allowed)}:\n" + "\n".join(upward)


def layer_of(module: str) -> int | None:
    """The PIPELINE_LAYERS index of a pipelines module (the longest prefix that names it), None for the package."""
    best = None
    for level, prefixes in enumerate(PIPELINE_LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (level, len(prefix))
    return None if best is None else best[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_pipelines_module_has_a_layer_and_every_room_a_docstring():
    modules = [module_name(p) for p in sorted(PIPELINES.rglob("*.py"))]
    unplaced = [m for m in modules if m not in ("sourcegate.pipelines",) and layer_of(m) is None]
    assert not unplaced, f"give these a layer in PIPELINE_LAYERS: {unplaced}"
    rooms = [p for p in PIPELINES.rglob("__init__.py")]
    undocumented = [str(p.relative_to(ROOT)) for p in rooms if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not undocumented, f"a room says in one line what it is: {undocumented}"


def test_a_folder_is_one_layer():
    """Rooms are layered whole: no entry names a module inside a room, so a folder cannot straddle layers."""
    inside = [prefix for layer in PIPELINE_LAYERS for prefix in layer if prefix.count(".") != 2]
    assert not inside, f"layer rooms, not modules inside them: {inside}"
    rooms = {d.name for d in PIPELINES.iterdir() if (d / "__init__.py").is_file()}
    layered = {prefix.split(".")[2] for layer in PIPELINE_LAYERS for prefix in layer}
    assert rooms <= layered, f"give these rooms a layer: {sorted(rooms - layered)}"


def test_records_sit_below_the_search_backends_and_release_policy_above_retrieval():
    """The floors: a backend may write a version's records but never judge it; the verdict may read retrieval."""
    assert (
        layer_of("sourcegate.pipelines.versions")
        < layer_of("sourcegate.pipelines.build")
        < layer_of("sourcegate.pipelines.search")
    )
    assert (
        layer_of("sourcegate.pipelines.retrieval")
        < layer_of("sourcegate.pipelines.release")
        < layer_of("sourcegate.pipelines.app")
    )


def test_a_pipelines_room_imports_nothing_above_it():
    upward = []
    for path in sorted(PIPELINES.rglob("*.py")):
        here = layer_of(module_name(path))
        for line, module, names in imports(path):
            targets = [f"{module}.{n}" for n in names if module_file(f"{module}.{n}")] or [module]
            for target in targets:
                there = layer_of(target)
                if here is not None and there is not None and there > here:
                    upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not upward, "a lower room imports a higher one:\n" + "\n".join(upward)


def test_every_first_party_import_names_something_that_exists():
    """A moved or renamed module or function leaves no import behind, even in code the fast tier never runs
    (benchmarks, DAG task bodies, lazy imports inside functions)."""
    dangling = []
    for path in first_party_files():
        for line, module, names in imports(path):
            if module.split(".")[0] not in PACKAGES:
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            target = module_file(module)
            if target is None:
                dangling.append(f"{where}: no module {module}")
                continue
            defined = top_level_names(target)
            for name in names:
                if module_file(f"{module}.{name}") is None and defined is not None and name not in defined:
                    dangling.append(f"{where}: {module} has no {name}")
    assert not dangling, "\n".join(dangling)


def import_graph(packages: tuple[str, ...] = LIBRARY) -> dict[str, set[str]]:
    """module -> the first-party modules it imports, at any depth (type-checking and lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(p for package in packages for p in folder(package).rglob("*.py")):
        here = module_name(path)
        graph[here] = set()
        for _, module, names in imports(path):
            if library_package(module) in packages:
                targets = [f"{module}.{n}" for n in names if module_file(f"{module}.{n}")] or [module]
                graph[here] |= set(targets) - {here}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a longer loop (strongly connected
    components of more than one module), each sorted."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules deep at most
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in graph:
                continue
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(found)


def test_no_two_modules_import_each_other():
    """A circle (the OpenSearch store calling the loader that types itself by the store) makes neither side
    readable or testable alone; the loader depends on a protocol of what it needs instead."""
    found = circles(import_graph())
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_sees_a_loop_of_any_length():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_checks_see_a_dangling_and_an_upward_import(tmp_path):
    """The scanner reads imports inside functions too (where this project puts its lazy ones)."""
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from sourcegate.pipelines.no_such_module import x\n    from sourcegate.pipelines.app.steps import nothing_here\n"
    )
    found = imports(source)
    assert [(line, module) for line, module, _ in found] == [
        (2, "sourcegate.pipelines.no_such_module"),
        (3, "sourcegate.pipelines.app.steps"),
    ]
    assert (
        module_file("sourcegate.pipelines.no_such_module") is None
        and module_file("sourcegate.pipelines.app.steps") is not None
    )
    assert "nothing_here" not in top_level_names(PIPELINES / "app" / "steps.py")
    assert "evaluate_step" in top_level_names(PIPELINES / "app" / "steps.py")


def functions_longer_than(paths: list[Path], lines: int) -> list[str]:
    """`file:line name (n lines)` of every function in `paths` longer than `lines`."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > lines
    ]


def test_no_benchmark_function_runs_past_100_lines():
    """A benchmark is its steps as functions over the shared harness (benchmarks/_common.py), not one long main."""
    long = functions_longer_than(sorted((ROOT / "benchmarks").glob("*.py")), 100)
    assert not long, "split these:\n" + "\n".join(long)


def test_training_sits_above_retrieval_and_below_the_application_and_each_function_fits_a_screen():
    """The trainers read retrieval (the passages a model learns) and the application calls them; a training
    function over 80 lines is several steps that want names of their own."""
    assert (
        layer_of("sourcegate.pipelines.retrieval")
        < layer_of("sourcegate.pipelines.training")
        < layer_of("sourcegate.pipelines.app")
    )
    long = functions_longer_than(sorted((PIPELINES / "training").rglob("*.py")), 80)
    assert not long, "split these:\n" + "\n".join(long)


# They time the imports a CLI command pays (the cold query, the serve process), so they import those modules.
TIMES_THE_CLI_IMPORTS = ("benchmarks/query_speed.py", "benchmarks/serve_load.py")


def test_benchmarks_reach_the_application_only_through_the_public_api():
    """sourcegate/api.py is the surface a script may rely on; a step's internals can change under it."""
    inside = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "benchmarks").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in TIMES_THE_CLI_IMPORTS
        for line, module, _ in imports(path)
        if module == "sourcegate.pipelines.app" or module.startswith("sourcegate.pipelines.app.")
    ]
    assert not inside, "import these from sourcegate.api:\n" + "\n".join(inside)


def parameters(path: Path) -> dict[str, list[str]]:
    """Each top-level function of `path` and its parameters' names, in order."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name: [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def test_a_step_takes_where_it_works_first_and_never_a_bare_run_id():
    """Where a run's file gets its path is the run folder (sourcegate/artifact_io/run_folder.py): a step is handed
    the run (or, for a step over the whole store, the artifacts folder) and never rebuilds it from a config and a
    run id, so a staged scratch folder is a run's root, not a rewritten config."""
    steps = {name: args for name, args in parameters(PIPELINES / "app" / "steps.py").items() if name.endswith("_step")}
    assert len(steps) >= 10, sorted(steps)
    wrong = {name: args for name, args in steps.items() if args[0] not in ("run", "root") or "run_id" in args}
    assert not wrong, wrong


def test_evals_and_version_records_never_receive_the_whole_config():
    """The evaluation reads typed sections (harness.Judging); a version's records know nothing of the config."""
    paths = sorted((ROOT / "sourcegate" / "evals").rglob("*.py")) + sorted((PIPELINES / "versions").glob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Name) and node.id == "PipelineConfig")
        or (isinstance(node, ast.Attribute) and node.attr == "PipelineConfig")
        or (isinstance(node, ast.arg) and node.arg == "cfg")
    ]
    assert not found, "these take the whole config:\n" + "\n".join(found)
