"""Issue 26 §2 (HOUSE_STYLE habit 12): no module imports another package's private or internal
names. What a package does not promise changes in a patch release, so depending on it pins the
package exactly and blocks every security update.

Read from the source with `ast`, every import (inside functions and under TYPE_CHECKING too) in
shared/, writer/ and gateway/. Private: a module or a name with a leading underscore (`starlette._
exception_handler`, `from x import _helper`). Internal: below the top of a package that promises
only its top-level names (uvicorn documents `uvicorn.run`, `uvicorn.Config` and `uvicorn.Server`;
`uvicorn.protocols.*`, `uvicorn.lifespan.*`, `uvicorn.server.ServerState` are its insides). A
failure names the file, the line and the import.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOP_FOLDERS = ("shared", "writer", "gateway")

# Packages whose only promise is their top-level names: any submodule is internal.
TOP_LEVEL_ONLY = frozenset({"uvicorn", "httptools", "uvloop"})


def private_or_internal(module: str, names: list[str]) -> str | None:
    """Why importing `names` from `module` (or `module` itself, names empty) is not allowed."""
    parts = module.split(".")
    if parts[0] == "arkvory" or module == "__future__":
        return None
    if any(part.startswith("_") for part in parts):
        return f"{module} is a private module"
    if parts[0] in TOP_LEVEL_ONLY and len(parts) > 1:
        return f"{module} is inside {parts[0]}, which promises only its top-level names"
    hidden = [name for name in names if name.startswith("_")]
    if hidden:
        return f"{', '.join(hidden)} of {module} {'is' if len(hidden) == 1 else 'are'} private"
    return None


def offences(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            checks = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            checks = [(node.module, [alias.name for alias in node.names])]
        else:
            continue  # a relative import is our own
        for module, names in checks:
            why = private_or_internal(module, names)
            if why:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {why}")
    return found


def test_no_module_imports_a_private_or_internal_name_of_another_package():
    found = [
        offence
        for top in TOP_FOLDERS
        for path in sorted((ROOT / top).rglob("*.py"))
        for offence in offences(path)
    ]
    assert found == []


def test_the_rule_names_what_it_refuses():
    assert private_or_internal("uvicorn.protocols.http.httptools_impl", ["HttpToolsProtocol"])
    assert private_or_internal("uvicorn.server", ["ServerState"])
    assert private_or_internal("uvicorn.lifespan.on", ["LifespanOn"])
    assert private_or_internal("starlette._exception_handler", ["wrap_app_handling_exceptions"])
    assert private_or_internal("starlette.routing", ["_helper"])
    assert private_or_internal("httptools.parser.errors", ["HttpParserError"])
    assert private_or_internal("uvicorn", ["Config", "Server"]) is None
    assert private_or_internal("httptools", ["HttpRequestParser", "parse_url"]) is None
    assert private_or_internal("starlette.requests", ["Request"]) is None
    assert private_or_internal("__future__", ["annotations"]) is None
    assert private_or_internal("arkvory.shared.http._anything", ["_ours"]) is None
