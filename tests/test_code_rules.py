"""Rules of the code that no behaviour test would catch in time, read from the source with `ast`
(shared/, writer/, gateway/). A failure names the file, the line and what to do instead.

- Every wait for a pool connection has a timeout: `pool.acquire(timeout=...)` or
  `shared.db.pooled(pool)`, never `pool.acquire()` nor the pool's shortcuts (`pool.fetch`,
  `pool.execute`, ...), which acquire without one: a pool emptied by a stuck query would
  otherwise hang its caller for ever (issue 22).
- No transaction is open across a call that may reach the storage (an object store's request
  may take minutes: writer/blobs/locks.py says how the blob protocol does without
  it). Checked lexically inside `async with ....transaction()` blocks, and inside any function
  that takes an `asyncpg.Connection` (it may run in its caller's transaction). "Reaches the
  storage" is a call on a `storage`/`store` object other than the methods documented as local
  (LOCAL_STORAGE_CALLS), or a call of a function of ours that does (by name, transitively).
  The name-based call graph over-approximates; it does not see calls through variables.
- A route reads its query only through `shared/http/query.py`'s `query_value` (the writer's
  `request_inputs.query`), never `request.query_params`: a parameter a route reads but does not
  declare is then a 500 its tests find, not a silent gap between the route and its OpenAPI
  operation. The console (writer/console/) reads its own pages' queries, which are not the API's.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOP_FOLDERS = ("shared", "writer", "gateway")

# asyncpg.Pool methods that take a connection from the pool without an acquire timeout.
POOL_SHORTCUTS = frozenset(
    {"fetch", "fetchval", "fetchrow", "execute", "executemany", "copy_from_query", "copy_from_table",
     "copy_to_table", "copy_records_to_table"}
)
# BlobStorage calls that never reach an object store (shared/storage/interface.py says so).
LOCAL_STORAGE_CALLS = frozenset(
    {"blob_file", "upload_session_file", "free_bytes", "require_room", "acquire_file", "release_file",
     "publish", "describe"}
)
STORAGE_NAMES = frozenset({"storage", "store"})
# Start-up takes one connection, outside any transaction, before the process serves: it checks
# and creates the storage's identity with it (shared/storage/opening.py).
START_UP = frozenset(
    {"open_storage", "prepare_storage", "verify_storage", "prepare_object_storage", "check_storage",
     "prepare_writer_state", "_start_writer", "_start_gateway", "_check_beside_a_running_writer"}
)


def sources() -> list[pathlib.Path]:
    return sorted(p for top in TOP_FOLDERS for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


@functools.cache
def parsed(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def where(path: pathlib.Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


def terminal_name(node: ast.AST) -> str | None:
    """`pool` of `pool`, `self.pool`, `ctx.runtime.pool`; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def is_pool(node: ast.AST) -> bool:
    name = terminal_name(node)
    return name is not None and "pool" in name.lower()


# -- pool waits ---------------------------------------------------------------------------------


def pool_waits_without_timeout(path: pathlib.Path, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method, receiver = node.func.attr, node.func.value
        if not is_pool(receiver):
            continue
        if method == "acquire":
            timeout = next((k.value for k in node.keywords if k.arg == "timeout"), None)
            if timeout is None or (isinstance(timeout, ast.Constant) and timeout.value is None):
                found.append(f"{where(path, node)}: {ast.unparse(node)} waits for a connection without a timeout")
        elif method in POOL_SHORTCUTS:
            found.append(
                f"{where(path, node)}: {ast.unparse(node.func)}() acquires without a timeout: use"
                " `async with pooled(pool) as conn:` (shared/db.py)"
            )
    return found


def test_every_pool_wait_has_a_timeout():
    found = [line for path in sources() for line in pool_waits_without_timeout(path, parsed(path))]
    assert not found, "\n".join(found)


def test_the_pool_rule_sees_what_it_forbids():
    tree = ast.parse(
        "async def f(ctx, pool):\n"
        "    async with ctx.pool.acquire() as conn: pass\n"
        "    async with self.pool.acquire(timeout=None) as conn: pass\n"
        "    await pool.fetchval('SELECT 1')\n"
        "    async with pool.acquire(timeout=10) as conn: pass\n"
        "    async with pooled(pool) as conn: pass\n"
    )
    found = pool_waits_without_timeout(ROOT / "writer" / "example.py", tree)
    assert [line.split(": ", 1)[0] for line in found] == ["writer/example.py:2", "writer/example.py:3", "writer/example.py:4"]


# -- the storage inside transactions ---------------------------------------------------------------


def imported_modules(tree: ast.Module) -> set[str]:
    """Names bound to modules by this file's imports (`from . import store` is the task store,
    not the storage)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def storage_call(node: ast.Call, modules: set[str]) -> bool:
    """A call on a storage object that may reach an object store."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr in LOCAL_STORAGE_CALLS:
        return False
    receiver = func.value
    while isinstance(receiver, (ast.Attribute, ast.Call)):
        if isinstance(receiver, ast.Attribute) and receiver.attr in STORAGE_NAMES:
            return True
        receiver = receiver.value if isinstance(receiver, ast.Attribute) else receiver.func
    return isinstance(receiver, ast.Name) and receiver.id in STORAGE_NAMES and receiver.id not in modules


def calls_in(body: list[ast.stmt]) -> list[ast.Call]:
    """The calls in these statements, not those of functions defined in them (they run later)."""
    found: list[ast.Call] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


@dataclasses.dataclass(frozen=True)
class Function:
    path: pathlib.Path
    node: ast.FunctionDef | ast.AsyncFunctionDef
    modules: frozenset[str]
    method: bool  # defined in a class: reached as `self.name(...)`, else as `name(...)`

    @property
    def params(self) -> set[str]:
        args = self.node.args
        return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def functions_of(path: pathlib.Path, tree: ast.Module) -> list[Function]:
    modules = frozenset(imported_modules(tree))
    found = []

    def visit(node: ast.AST, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(Function(path, child, modules, in_class))
                visit(child, False)
            else:
                visit(child, in_class or isinstance(child, ast.ClassDef))

    visit(tree, False)
    return found


def functions() -> list[Function]:
    return [f for path in sources() for f in functions_of(path, parsed(path))]


@dataclasses.dataclass
class Reaching:
    """Names of our functions and methods that call the storage, directly or through others."""

    functions: set[str] = dataclasses.field(default_factory=set)
    methods: set[str] = dataclasses.field(default_factory=set)

    def calls(self, call: ast.Call, caller: Function) -> bool:
        func = call.func
        if isinstance(func, ast.Name):  # a parameter of that name is some callable, not ours
            return func.id in self.functions and func.id not in caller.params
        return (
            isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id in ("self", "cls") and func.attr in self.methods
        )


def reaching_the_storage(all_functions: list[Function]) -> Reaching:
    """A fixpoint over the name-based call graph: `f(...)` is a module function of ours, and
    `self.f(...)` a method of ours; a method called on anything else is not followed
    (`conn.fetch`, `handle.write`: the names collide too much to mean anything)."""
    reaching = Reaching()
    while True:
        grew = False
        for f in all_functions:
            names = reaching.methods if f.method else reaching.functions
            if f.node.name in names:
                continue
            if any(storage_call(call, f.modules) or reaching.calls(call, f) for call in calls_in(f.node.body)):
                names.add(f.node.name)
                grew = True
        if not grew:
            return reaching


def is_transaction(item: ast.withitem) -> bool:
    call = item.context_expr
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "transaction"


def takes_a_connection(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A parameter annotated as a database connection (it may be in its caller's transaction)."""
    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    return any(a.annotation is not None and ast.unparse(a.annotation) == "asyncpg.Connection" for a in args)


def storage_inside_transactions(all_functions: list[Function], reaching: Reaching) -> list[str]:
    found = []

    def check(f: Function, body: list[ast.stmt], inside: str) -> None:
        for call in calls_in(body):
            if storage_call(call, f.modules):
                found.append(f"{where(f.path, call)}: {ast.unparse(call.func)}() reaches the storage {inside}")
            elif reaching.calls(call, f):
                found.append(f"{where(f.path, call)}: {ast.unparse(call.func)}() may reach the storage {inside}")

    for f in all_functions:
        if takes_a_connection(f.node) and f.node.name not in START_UP:
            check(f, f.node.body, f"in {f.node.name}(), which takes a connection (maybe in a transaction)")
        for node in ast.walk(f.node):
            if isinstance(node, ast.AsyncWith) and any(is_transaction(item) for item in node.items):
                check(f, node.body, f"inside the transaction of line {node.lineno}")
    return sorted(set(found))


def test_no_transaction_is_open_across_a_storage_call():
    all_functions = functions()
    found = storage_inside_transactions(all_functions, reaching_the_storage(all_functions))
    assert not found, "\n".join(found)


def test_the_storage_rule_sees_what_it_forbids():
    source = (
        "from . import store\n"
        "async def look(storage, sha256):\n"
        "    return await storage.stat(sha256)\n"
        "async def f(pool, ctx):\n"
        "    async with pooled(pool) as conn, conn.transaction():\n"
        "        await ctx.storage.delete([])\n"
        "        await look(ctx.storage, 'x')\n"
        "        await store.transition(conn)\n"
        "        ctx.storage.blob_file('x')\n"
        "    await ctx.storage.delete([])\n"
        "async def g(conn: asyncpg.Connection, storage):\n"
        "    await storage.quarantine('x')\n"
    )
    path = ROOT / "writer" / "example.py"
    tree = ast.parse(source)
    example = functions_of(path, tree)
    found = storage_inside_transactions(example, reaching_the_storage(example))
    assert [line.split(": ", 1)[0] for line in found] == [
        "writer/example.py:12", "writer/example.py:6", "writer/example.py:7",
    ], found


# -- query parameters -------------------------------------------------------------------------------

QUERY_READERS = ("shared/http/query.py",)  # the one reader of `query_params`
NOT_API = ("writer/console/",)  # its pages' queries are the console's own


def undeclared_query_reads(path: pathlib.Path, tree: ast.Module) -> list[str]:
    relative = str(path.relative_to(ROOT))
    if relative in QUERY_READERS or relative.startswith(NOT_API):
        return []
    return [
        f"{where(path, node)}: read the query with query_value (shared/http/query.py), which the route declares"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "query_params"
    ]


def test_routes_read_only_the_query_parameters_they_declare():
    found = [line for path in sources() for line in undeclared_query_reads(path, parsed(path))]
    assert not found, "\n".join(found)


def test_the_query_rule_sees_what_it_forbids():
    tree = ast.parse("async def f(request):\n    return request.query_params.get('x')\n")
    assert undeclared_query_reads(ROOT / "writer" / "example.py", tree) == [
        "writer/example.py:2: read the query with query_value (shared/http/query.py), which the route declares"
    ]
    assert undeclared_query_reads(ROOT / "writer" / "console" / "example.py", tree) == []
