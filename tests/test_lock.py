"""The lock files agree with pyproject.toml (issue 26 §1): every dependency it declares is pinned,
inside its range, the server's own at the range's lower bound (so the locked CI run tests the
bounds pyproject.toml promises), with hashes, and the two locks pin what they share alike.

A failure here means a range changed without the locks: `bash .ci/lock` writes them again.
"""

from __future__ import annotations

import pathlib
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SERVER_LOCK = ROOT / "requirements.lock"
TEST_LOCK = ROOT / "requirements-test.lock"
FIX = "run `bash .ci/lock` to write the lock files again"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==([^\s;\\]+)")


def pins_of(lock: pathlib.Path) -> dict[str, tuple[Version, list[str]]]:
    """name -> (version, its hashes), from a pip requirements file as uv writes it."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    current = None
    for line in lock.read_text().splitlines():
        found = _PIN.match(line)
        if found:
            current = canonicalize_name(found[1])
            pins[current] = (Version(found[2]), [])
        elif current and line.strip().startswith("--hash="):
            pins[current][1].append(line.strip().removeprefix("--hash=").rstrip(" \\"))
        elif not line.startswith(" "):
            current = None
    return pins


def requirements(*extras: str) -> list[Requirement]:
    declared = list(PROJECT["dependencies"])
    for extra in extras:
        declared += PROJECT["optional-dependencies"][extra]
    return [Requirement(text) for text in declared]


def lower_bound(requirement: Requirement) -> Version | None:
    bounds = [Version(spec.version) for spec in requirement.specifier if spec.operator in (">=", "==")]
    return max(bounds) if bounds else None


@pytest.mark.parametrize(
    ("lock", "extras"), [(SERVER_LOCK, ()), (TEST_LOCK, ("test", "seaweedfs"))], ids=lambda v: str(v)
)
def test_every_declared_dependency_is_pinned_inside_its_range_with_hashes(lock, extras):
    pins = pins_of(lock)
    problems = []
    for requirement in requirements(*extras):
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement} is not pinned in {lock.name}")
            continue
        version, hashes = pins[name]
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{lock.name} pins {name}=={version}, outside {requirement}")
        if not hashes:
            problems.append(f"{lock.name} pins {name}=={version} without a hash")
    problems += [f"{lock.name} pins {n}=={v} without a hash" for n, (v, h) in pins.items() if not h]
    assert not problems, f"{FIX}:\n  " + "\n  ".join(problems)


def test_the_servers_dependencies_are_locked_at_their_lower_bounds():
    """The locked run tests the oldest releases pyproject.toml admits; CI's newest run the rest."""
    pins = pins_of(SERVER_LOCK)
    problems = []
    for requirement in requirements():
        bound = lower_bound(requirement)
        name = canonicalize_name(requirement.name)
        if bound is None:
            problems.append(f"{requirement} has no lower bound: give its range the tested version")
        elif name in pins and pins[name][0] != bound:
            problems.append(f"{name}: locked {pins[name][0]}, the range's lower bound is {bound}")
    assert not problems, f"{FIX}:\n  " + "\n  ".join(problems)


def test_every_range_has_an_upper_bound():
    """A range open above lets a breaking major release reach users before CI has seen it."""
    unbounded = [
        str(requirement)
        for requirement in requirements(*PROJECT["optional-dependencies"])
        if not any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier)
    ]
    assert not unbounded, "ranges without an upper bound: " + ", ".join(unbounded)


def test_both_locks_pin_the_server_alike():
    server, test = pins_of(SERVER_LOCK), pins_of(TEST_LOCK)
    differ = [f"{n}: {server[n][0]} / {test[n][0]}" for n in server if n in test and server[n][0] != test[n][0]]
    missing = sorted(set(server) - set(test))
    assert not differ and not missing, f"{FIX}: differ {differ}, missing from the test lock {missing}"


def test_the_lock_reader_reads_markers_continuations_and_hashes(tmp_path):
    sample = tmp_path / "sample.lock"
    sample.write_text(
        "colorama==0.4.6 ; sys_platform == 'win32' \\\n"
        "    --hash=sha256:aa \\\n"
        "    --hash=sha256:bb\n"
        "    # via click\n"
        "Typing_Extensions==4.16.0 \\\n"
        "    --hash=sha256:cc\n"
    )
    assert pins_of(sample) == {
        "colorama": (Version("0.4.6"), ["sha256:aa", "sha256:bb"]),
        "typing-extensions": (Version("4.16.0"), ["sha256:cc"]),
    }
