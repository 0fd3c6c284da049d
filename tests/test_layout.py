"""The import rules of the code's layout (shared/__init__.py draws the layers), read from the
source with `ast`: every import counts, inside functions and under TYPE_CHECKING too, except
where a rule says otherwise. A failure names the file, the line and the import.

The installed package `arkvory` is the repository root (pyproject's package-dir): the module of
shared/auth/credentials.py is arkvory.shared.auth.credentials.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "arkvory"
TOP_FOLDERS = ("shared", "writer", "gateway")  # the root's own packages; tests/, bench/ are not

# Inside arkvory.shared, from the bottom up: a package imports only from itself, the basics and
# the packages of lower layers. http, storage and cluster share a layer and never import each other.
BASICS = frozenset({"settings", "errors", "logs", "metrics", "db", "migrations"})
LAYERS = {"http": 1, "storage": 1, "cluster": 1, "auth": 2, "download": 3, "process": 4, "cli": 5}
# Inside arkvory.writer (writer/__init__.py draws them), the same rule; app.py assembles them all.
WRITER_BASICS = frozenset({"idempotency", "openapi", "pagination", "request_inputs", "audit"})
WRITER_LAYERS = {
    "identity": 1, "tasks": 2, "catalog": 3, "blobs": 4, "uploads": 5, "maintenance": 6, "worker": 7, "console": 8,
    "app": 9,
}


@dataclasses.dataclass(frozen=True)
class Import:
    source: pathlib.Path  # the importing file
    line: int
    target: str  # the module imported (a submodule where `from X import name` names one)
    in_function: bool

    def __str__(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line} imports {self.target}"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def package_dirs() -> list[pathlib.Path]:
    """The root and every folder under shared/, writer/, gateway/ that holds Python files."""
    found = [ROOT]
    for top in TOP_FOLDERS:
        for directory in sorted({p.parent for p in (ROOT / top).rglob("*.py")} | {ROOT / top}):
            if "__pycache__" not in directory.parts:
                found.append(directory)
    return found


@functools.cache
def modules() -> dict[str, pathlib.Path]:
    found = {module_name(ROOT / "__init__.py"): ROOT / "__init__.py"}
    for top in TOP_FOLDERS:
        for path in sorted((ROOT / top).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _function_ranges(tree: ast.AST) -> list[tuple[int, int]]:
    return [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    ]


def imports_of(path: pathlib.Path, known: dict[str, pathlib.Path] | None = None) -> list[Import]:
    """Every import in `path`, resolved to absolute module names."""
    known = modules() if known is None else known
    tree = ast.parse(path.read_text(), str(path))
    functions = _function_ranges(tree)
    is_package = path.name == "__init__.py"
    name = module_name(path) if path.is_relative_to(ROOT) else path.stem
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        in_function = any(start <= node.lineno <= end for start, end in functions)
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from X import y` imports the submodule X.y when there is one
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        found += [Import(path, node.lineno, target, in_function) for target in dict.fromkeys(targets)]
    return found


@functools.cache
def all_imports() -> list[Import]:
    return [imp for path in modules().values() for imp in imports_of(path)]


def inside(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def fail_with(problems: list[str], rule: str) -> None:
    if problems:
        pytest.fail(f"{rule}:\n  " + "\n  ".join(problems), pytrace=False)


def test_the_client_library_imports_nothing_of_the_server():
    client = f"{PACKAGE}.shared.client"
    problems = [
        str(imp)
        for imp in all_imports()
        if inside(module_name(imp.source), client)
        and inside(imp.target, PACKAGE)
        and not inside(imp.target, client)
    ]
    fail_with(problems, f"{client} imports nothing of arkvory outside itself (users install it alone)")


def test_shared_imports_the_writer_and_the_gateway_only_in_its_command_line():
    cli = f"{PACKAGE}.shared.cli"
    problems = [
        str(imp)
        for imp in all_imports()
        if inside(module_name(imp.source), f"{PACKAGE}.shared")
        and not inside(module_name(imp.source), cli)
        and (inside(imp.target, f"{PACKAGE}.writer") or inside(imp.target, f"{PACKAGE}.gateway"))
    ]
    fail_with(problems, "arkvory.shared imports arkvory.writer and arkvory.gateway only in shared/cli/")


def test_the_gateway_never_imports_the_writer():
    problems = [
        str(imp)
        for imp in all_imports()
        if inside(module_name(imp.source), f"{PACKAGE}.gateway") and inside(imp.target, f"{PACKAGE}.writer")
    ]
    fail_with(problems, "arkvory.gateway never imports arkvory.writer")


def test_only_the_command_line_imports_the_command_line_and_the_client():
    """shared/cli/ assembles everything, so nothing below it may import it; the client library
    is for users, and of the server only the command line (its get/put/...) uses it."""
    problems = []
    for imp in all_imports():
        source = module_name(imp.source)
        for guarded, allowed in (
            (f"{PACKAGE}.shared.cli", (f"{PACKAGE}.shared.cli",)),
            (f"{PACKAGE}.shared.client", (f"{PACKAGE}.shared.cli", f"{PACKAGE}.shared.client", PACKAGE)),
        ):
            if inside(imp.target, guarded) and not any(
                source == a if a == PACKAGE else inside(source, a) for a in allowed
            ):
                problems.append(f"{imp}: only {' and '.join(allowed)} may import it")
    fail_with(problems, "the command line and the client library are leaves of the import graph")


def _python_files_of_the_repository() -> list[pathlib.Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if listed.returncode == 0:
        return [ROOT / name for name in listed.stdout.split() if (ROOT / name).is_file()]
    return [p for p in ROOT.rglob("*.py") if not {".venv", ".git", "build"} & set(p.parts)]


def test_nothing_imports_the_folders_by_their_top_level_names():
    """`shared`, `writer` and `gateway` are folders of the repository, installed as arkvory.*:
    importing them by their own names (possible from the repository root) loads a second copy
    of every module, with its own caches and locks."""
    old = TOP_FOLDERS
    problems = []
    for path in _python_files_of_the_repository():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # module names in strings: python -m shared.cli, importlib.import_module("writer.x")
                text = node.value
                names = [text] if text.count(".") and text.replace(".", "").replace("_", "").isalnum() else []
                names = [n for n in names if f"{PACKAGE}.{n}" in modules()]
            else:
                continue
            problems += [
                f"{path.relative_to(ROOT)}:{node.lineno} names {n}: write {PACKAGE}.{n}"
                for n in names
                if n.split(".")[0] in old
            ]
    fail_with(problems, "modules are named arkvory.shared, arkvory.writer, arkvory.gateway")


def _layer_of(module: str, top: str = "shared") -> tuple[str, int] | None:
    """(package, layer) of a module of arkvory.<top> (shared or writer); None outside it, or for
    shared's client."""
    basics, layers = (BASICS, LAYERS) if top == "shared" else (WRITER_BASICS, WRITER_LAYERS)
    parts = module.split(".")
    if parts[:2] != [PACKAGE, top]:
        return None
    if len(parts) == 2 or parts[2] in basics:
        return "basics", 0
    if top == "shared" and parts[2] == "client":
        return None  # its own rule
    if parts[2] not in layers:
        return f"an unplaced module ({parts[2]}: add it to the layers or the basics)", -1
    return parts[2], layers[parts[2]]


def _layer_problems(top: str, imports: list[Import] | None = None) -> list[str]:
    layers = LAYERS if top == "shared" else WRITER_LAYERS
    problems = []
    for imp in all_imports() if imports is None else imports:
        source, target = _layer_of(module_name(imp.source), top), _layer_of(imp.target, top)
        if source is None or target is None:
            continue
        (source_package, source_layer), (target_package, target_layer) = source, target
        if source_layer < 0 or target_layer < 0:
            problems.append(f"{imp}: {source_package if source_layer < 0 else target_package}")
        elif source_package != target_package and target_package != "basics" and target_layer >= source_layer:
            lower = sorted(p for p, layer in layers.items() if layer < source_layer)
            may = ", ".join(["itself", "the basics", *(f"{p}/" for p in lower)])
            problems.append(f"{imp}: {source_package}/ may import only {may}")
        elif source_package == "basics" and target_package != "basics":
            problems.append(f"{imp}: the basics import only each other")
    return problems


def test_the_layers_of_shared():
    fail_with(_layer_problems("shared"), "inside arkvory.shared, a package imports only from itself, the basics and lower layers")


def test_the_layers_of_the_writer():
    fail_with(_layer_problems("writer"), "inside arkvory.writer, a package imports only from itself, the basics and lower layers")


def test_the_layer_rule_catches_an_import_up():
    """The rule itself, on made-up imports: catalog/ importing uploads/ (a layer up) is refused,
    identity/ importing the basics is not."""
    def imports(source: str, target: str) -> list[Import]:
        path = ROOT / "writer" / source
        return [Import(path, 1, f"{PACKAGE}.writer.{target}", False)]

    assert _layer_problems("writer", imports("catalog/artifacts.py", "uploads.publishing"))
    assert _layer_problems("writer", imports("request_inputs.py", "identity.accounts"))
    assert not _layer_problems("writer", imports("identity/accounts.py", "pagination"))


def _cycles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle, as a path [a, b, ..., a], for each group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        for node in queue:  # breadth first: the shortest way from `start` to every member
            for nxt in sorted(graph[node] & group):
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
        last = min((n for n in group if start in graph[n]), key=lambda n: (len(paths[n]), n))
        cycles.append(paths[last] + [start])
    return sorted(cycles)


def test_no_module_imports_itself_through_others():
    """Module-level imports (TYPE_CHECKING ones included: they draw the same arrow) form no
    cycle. An import inside a function is the one deliberate way to defer one (the command line
    loads a subcommand's module only when it runs)."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    where: dict[tuple[str, str], Import] = {}
    for imp in all_imports():
        source = module_name(imp.source)
        if not imp.in_function and imp.target in known and imp.target != source:
            graph[source].add(imp.target)
            where.setdefault((source, imp.target), imp)
    problems = []
    for cycle in _cycles_in(graph):
        problems.append(" -> ".join(cycle))
        problems += [f"  {where[(a, b)]}" for a, b in zip(cycle, cycle[1:])]
    fail_with(problems, "modules that import each other (cut one arrow: pass the part, or a Protocol)")


def test_every_package_has_a_docstring_and_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    problems = []
    found = set()
    for directory in package_dirs():
        init = directory / "__init__.py"
        name = module_name(init)
        found.add(name)
        if not init.is_file():
            problems.append(f"{directory.relative_to(ROOT)}/ holds Python files but no __init__.py")
            continue
        if not (ast.get_docstring(ast.parse(init.read_text())) or "").strip():
            problems.append(f"{init.relative_to(ROOT)} has no docstring (say what lives here and what it may import)")
        if name not in listed:
            problems.append(f"{name} ({directory.relative_to(ROOT)}/) is missing from pyproject's packages")
    problems += [f"pyproject lists {name}, which is no package folder" for name in sorted(listed - found)]
    fail_with(problems, "every package says what it is and is installed")


def test_the_runtime_is_what_lower_packages_take_of_it(tmp_path):
    """download/ and the worker's health routes describe what they read of their process as a
    Protocol instead of importing it: the processes must still have every member."""
    from arkvory.shared.auth.identity import KeyRing
    from arkvory.shared.download.serving import ServingProcess
    from arkvory.shared.process.runtime import Runtime
    from arkvory.shared.settings import Settings
    from arkvory.writer.worker.health import WorkerState
    from arkvory.writer.worker.process import WorkerProcess

    settings = Settings.from_env(
        {"ARKVORY_DATABASE_URL": "postgresql://arkvory@127.0.0.1:1/arkvory", "ARKVORY_DATA_DIR": str(tmp_path)}
    )
    for protocol, process in (
        (ServingProcess, Runtime(settings, KeyRing.empty())),
        (WorkerState, WorkerProcess(settings, KeyRing.empty(), None, None, 1)),
    ):
        members = set(getattr(protocol, "__annotations__", {})) | {
            name for name in vars(protocol) if not name.startswith("_")
        }
        missing = sorted(name for name in members if not hasattr(process, name))
        assert not missing, f"{type(process).__name__} lacks {missing} of {protocol.__name__}"


def test_the_package_face_hands_on_the_client_without_loading_it():
    import arkvory
    import arkvory.shared.client

    assert arkvory.__all__ == arkvory.shared.client.__all__
    probe = (
        "import sys, arkvory, arkvory.shared.settings, arkvory.shared.process.runtime, arkvory.writer.app;"
        "print(sorted(m for m in ('httpx', 'tenacity', 'tqdm', 'arkvory.shared.client.api') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
