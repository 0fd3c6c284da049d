"""`arkvory get|put|ls|stat|rm`: the client library (shared/client) on the command line (SPEC §10);
`login` and `token` are in credential_commands.py, `retention` in retention_commands.py.

Registered by shared/cli/main.py. Every import that costs (httpx, tenacity, tqdm, the library itself)
happens inside a command, so `arkvory serve` and `arkvory --help` load none of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import uuid
from typing import Any

from .cli_config import client_for
from .cli_output import EXIT_AUTH, EXIT_CODES_HELP, EXIT_INTERRUPTED, Output, failure_from, human_size
from .cli_parsing import CommandUsageError

CONNECTION_HELP = """\
server and token:
  --url URL (repeatable) or ARKVORY_URL (comma-separated): the servers to try, in order.
  ARKVORY_TOKEN, or a profile in $XDG_CONFIG_HOME/arkvory/config.toml (default
  ~/.config/arkvory/config.toml, mode 0600) chosen by --profile, ARKVORY_PROFILE or the file's
  default_profile:  [profiles.NAME] with url = "..." and token = "..." (`arkvory login`
  writes one). A token is never a command-line option.
  get needs any server (a read gateway will do); the other commands need the writer or a
  balancer: a URL found to be a read gateway is skipped.
"""

NO_TOKEN_HINT = "no token was given: run `arkvory login ACCOUNT`, or set ARKVORY_TOKEN (see --help)"
# What an interrupted (Ctrl-C) command left, for the two that continue where they stopped.
RESUME_HINTS = {
    "get": "the bytes that arrived are kept beside the file (.part); the same command resumes from there",
    "put": "the same command resumes the upload",
}

# The longest file name most filesystems take, in bytes.
MAX_FILE_NAME_BYTES = 255


def register(commands: argparse._SubParsersAction, admin: argparse._SubParsersAction) -> None:
    """Add this package's subcommands to the top-level `commands` and to `arkvory admin`."""
    common = _common_options()

    def add(name: str, summary: str, handler, parent=None) -> argparse.ArgumentParser:
        """A subcommand of `arkvory` (or of `parent`); without a handler, a group of them
        (`token`), which takes no options of its own: argparse would let its subcommands'
        defaults overwrite them."""
        leaf = handler is not None
        command = (parent or commands).add_parser(
            name, parents=[common] if leaf else [], help=summary, description=summary,
            epilog=f"{CONNECTION_HELP}\n{EXIT_CODES_HELP}" if leaf else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if leaf:
            command.set_defaults(func=_runner(handler))
        return command

    get = add(
        "get", "download an artifact (by id, asset path or package version), resuming after cuts "
        "and checking its SHA-256", cmd_get,
    )
    get.add_argument("repo", metavar="REPO")
    get.add_argument("artifact_id", metavar="ARTIFACT_ID", nargs="?", help="the artifact's id (a UUID)")
    get.add_argument("--asset", metavar="PATH", help="the artifact an asset path points at")
    get.add_argument("--package", metavar="GROUP/NAME@VERSION", help="the artifact of a package version")
    get.add_argument(
        "-o", "--output", metavar="FILE",
        help="where to save it (a directory: the default name inside it); default: the artifact's "
        "name, the asset path's last segment or the package name, in the current directory; "
        "its directory must exist",
    )
    get.add_argument(
        "--fsync", action="store_true",
        help="like curl and wget, get leaves writing back to the kernel; --fsync waits until the "
        "file is on disk (fsync before the rename into place, then of the directory), at the "
        "disk's write speed",
    )

    put = add(
        "put", "upload a file as an artifact (safe to re-run: an interrupted upload resumes, a "
        "finished one is not duplicated)", cmd_put,
    )
    put.add_argument("repo", metavar="REPO")
    put.add_argument("file", metavar="FILE")
    put.add_argument("--name", metavar="N", help="the artifact's name (default: FILE's name)")
    put.add_argument("--asset", metavar="PATH", help="also point this asset path at the new artifact")
    put.add_argument("--media-type", metavar="TYPE", help="the artifact's media type")

    ls = add("ls", "list a repository's artifacts", cmd_ls)
    ls.add_argument("repo", metavar="REPO")

    stat = add("stat", "show an artifact's metadata", cmd_stat)
    stat.add_argument("repo", metavar="REPO")
    stat.add_argument("artifact_id", metavar="ARTIFACT_ID")

    rm = add("rm", "delete an artifact (refused while a package or asset uses it)", cmd_rm)
    rm.add_argument("repo", metavar="REPO")
    rm.add_argument("artifact_id", metavar="ARTIFACT_ID")

    from . import account_commands, credential_commands, key_commands

    credential_commands.register(add)
    key_commands.register(add)
    from . import retention_commands

    retention_commands.register(add)
    account_commands.register(add)


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", action="append", metavar="URL",
        help="a server (or balancer) base URL; repeat to give fallbacks (default: ARKVORY_URL)",
    )
    common.add_argument("--profile", metavar="NAME", help="the config file profile to use")
    common.add_argument(
        "--retries", type=_non_negative_int, metavar="N",
        help="retries of a failed request after the first attempt (default: the library's)",
    )
    common.add_argument(
        "--retry-time", type=_positive_seconds, metavar="SECONDS",
        help="give up retrying after this long in total (default: the library's)",
    )
    common.add_argument("--json", action="store_true", help="print one JSON result on stdout, errors too")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no messages")
    return common


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _refused_token_hint(args: argparse.Namespace) -> str:
    """What to do when the server refused the token given (401, not a 403 for a missing right):
    it expired or was revoked. ARKVORY_TOKEN wins over the config file's, so a new login alone
    would not help while it is set."""
    if args.profile is None and os.environ.get("ARKVORY_TOKEN"):
        return "it came from ARKVORY_TOKEN and may have expired or been revoked: set a valid one, or unset it to use the config file's"
    return "it may have expired or been revoked: run `arkvory login ACCOUNT` for a new one (see --help)"


def _runner(handler):
    """Run one command; whatever it raises becomes one error line (or JSON) and an exit code."""

    def run(args: argparse.Namespace) -> int:
        output = Output(as_json=args.json, quiet=args.quiet)
        output.show_retries()
        try:
            return handler(args, output) or 0
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - the CLI's one edge: never a traceback
            failure = failure_from(exc)
            connection = getattr(args, "connection", None)
            if failure.exit_code == EXIT_AUTH and connection is not None and connection.token is None:
                failure = dataclasses.replace(failure, message=f"{failure.message}; {NO_TOKEN_HINT}")
            elif failure.exit_code == EXIT_INTERRUPTED and args.command in RESUME_HINTS:
                failure = dataclasses.replace(failure, message=f"{failure.message}: {RESUME_HINTS[args.command]}")
            elif failure.code == "unauthorized" and connection is not None and args.command != "login":
                failure = dataclasses.replace(failure, message=f"{failure.message}; {_refused_token_hint(args)}")
            return output.failure(failure)

    return run


def _bar(args: argparse.Namespace, description: str):
    import sys

    from .cli_progress import progress_bar, wants_bar

    return progress_bar(description, enabled=wants_bar(sys.stderr, quiet=args.quiet, as_json=args.json))


# get --------------------------------------------------------------------------------------------


def parse_package(text: str) -> tuple[str, str, str]:
    """`GROUP/NAME@VERSION` → (group, name, version); the group may hold '/', the name not."""
    coordinates, at, version = text.rpartition("@")
    group, slash, name = coordinates.rpartition("/")
    if not (at and slash and group and name and version):
        raise CommandUsageError(f"--package: expected GROUP/NAME@VERSION, got {text!r}")
    return group, name, version


def safe_file_name(name: str) -> str | None:
    """A name from the server (or an asset path) made safe to create in the current directory:
    its last path segment, no control characters, no leading dots (so never `.` or `..`, nor a
    hidden file), at most 255 bytes. None when nothing usable is left."""
    last = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = "".join(ch for ch in last if ch.isprintable()).strip().lstrip(".").strip()
    encoded = cleaned.encode("utf-8")[:MAX_FILE_NAME_BYTES]
    cleaned = encoded.decode("utf-8", errors="ignore")
    return cleaned or None


def _target(args: argparse.Namespace) -> dict[str, Any]:
    """The library's download keywords for the one thing asked for."""
    asked = [x for x in (args.artifact_id, args.asset, args.package) if x is not None]
    if len(asked) != 1:
        raise CommandUsageError("give exactly one of ARTIFACT_ID, --asset PATH or --package GROUP/NAME@VERSION")
    if args.artifact_id is not None:
        return {"artifact_id": _artifact_id(args.artifact_id)}
    if args.asset is not None:
        if not args.asset.strip("/"):
            raise CommandUsageError("--asset: expected an asset path, got an empty one")
        return {"asset": args.asset}
    return {"package": parse_package(args.package)}


def _artifact_id(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise CommandUsageError(f"ARTIFACT_ID: expected a UUID, got {text!r}") from None


def _default_name(client, repo: str, target: dict[str, Any]) -> str:
    if "artifact_id" in target:
        # From the content route's Content-Disposition: every process serves it, so a get
        # pointed at a read gateway alone works (the metadata route is the writer's).
        offered = client.offered_name(repo, **target) or ""
    elif "asset" in target:
        offered = target["asset"]
    else:
        offered = target["package"][1]
    name = safe_file_name(offered)
    if name is None:
        raise CommandUsageError(f"{offered!r} is not a usable file name here; choose one with -o FILE")
    return name


def _destination(client, args: argparse.Namespace, target: dict[str, Any]) -> pathlib.Path:
    if args.output is not None:
        chosen = pathlib.Path(args.output)
        # The user's own path goes wherever they say; only a name the server offers is confined.
        return chosen / _default_name(client, args.repo, target) if chosen.is_dir() else chosen
    cwd = pathlib.Path.cwd()
    dest = cwd / _default_name(client, args.repo, target)
    if dest.parent != cwd:  # safe_file_name guarantees this; a second lock on the same door
        raise CommandUsageError(f"refusing to write {dest} outside {cwd}; choose a name with -o FILE")
    return dest


def cmd_get(args: argparse.Namespace, output: Output) -> int:
    target = _target(args)
    with client_for(args) as client:
        dest = _destination(client, args, target)
        with _bar(args, dest.name) as progress:
            result = client.download(args.repo, dest, progress=progress, durable=args.fsync, **target)
    if result.continued_bytes:
        output.note(
            f"resumed {dest.name}: {result.continued_bytes} bytes ({human_size(result.continued_bytes)}) "
            "were already there from an earlier run"
        )
    output.note(f"saved {result.path} ({human_size(result.size)}, sha256 {result.sha256})")
    output.result(
        {
            "path": os.path.abspath(result.path),
            "size": result.size,
            "sha256": result.sha256,
            "etag": result.etag,
            "resumed_bytes": result.resumed_bytes,
            "restarts": result.restarts,
            "attempts": result.attempts,
            "continued_bytes": result.continued_bytes,
        }
    )
    return 0


# put, ls, stat, rm ------------------------------------------------------------------------------


def cmd_put(args: argparse.Namespace, output: Output) -> int:
    path = pathlib.Path(args.file)
    with client_for(args) as client, _bar(args, path.name) as progress:
        artifact = client.upload(
            args.repo, path, name=args.name, asset=args.asset, media_type=args.media_type,
            progress=progress,
        )
    where = f", asset {args.asset}" if args.asset else ""
    if artifact.stored_already:
        output.note(
            f"{artifact.get('name')} is already in {args.repo} with these bytes, as {artifact.get('id')} "
            f"({human_size(artifact.get('size'))}{where}): nothing was sent"
        )
    else:
        output.note(
            f"uploaded {artifact.get('name')} as {artifact.get('id')} "
            f"({human_size(artifact.get('size'))}{where})"
        )
    output.result(artifact, human=str(artifact.get("id")))
    return 0


def cmd_ls(args: argparse.Namespace, output: Output) -> int:
    with client_for(args) as client:
        artifacts = list(client.list_artifacts(args.repo))
    lines = [
        f"{a.get('id')}  {a.get('size', ''):>12}  {a.get('createdAt', '')}  {a.get('name', '')}"
        for a in artifacts
    ]
    output.result({"artifacts": artifacts}, human="\n".join(lines))
    return 0


def cmd_stat(args: argparse.Namespace, output: Output) -> int:
    artifact_id = _artifact_id(args.artifact_id)
    with client_for(args) as client:
        artifact = client.stat(args.repo, artifact_id)
    width = max((len(k) for k in artifact), default=0)
    output.result(artifact, human="\n".join(f"{k:<{width}}  {v}" for k, v in artifact.items()))
    return 0


def cmd_rm(args: argparse.Namespace, output: Output) -> int:
    artifact_id = _artifact_id(args.artifact_id)
    with client_for(args) as client:
        client.delete(args.repo, artifact_id)
    output.note(f"deleted {artifact_id} from {args.repo}")
    output.result({"deleted": artifact_id, "repository": args.repo})
    return 0
