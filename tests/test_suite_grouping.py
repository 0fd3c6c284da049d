"""The suite's own parallel layout: `--dist loadgroup` keeps a group on one xdist worker.

Modules that share a module-scoped cluster are grouped (tests/conftest.py), so the cluster starts
once; if the grouping silently stops (pytest 9.2 with xdist 3.8 did: pytest-dev/pytest-xdist#1386),
every worker starts every such cluster again and the default tier takes minutes longer without
anything failing. This runs a small suite of its own the way pyproject's addopts run ours.
"""

from __future__ import annotations

import os
import subprocess
import sys

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.mark.parametrize("case", range(8))
def test_case(case):
    with open(os.environ["GROUP_SEEN"], "a") as seen:  # (a worker's output is not relayed)
        seen.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_a_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this project's addopts and conftest
    seen = tmp_path / "seen"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "PYTHONPATH"))}
    env["GROUP_SEEN"] = str(seen)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup", "-q",
         "test_grouped.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = seen.read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, f"one group ran on {sorted(set(workers))}"
