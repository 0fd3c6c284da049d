"""`arkvory worker` (and every other `arkvory` command) with the test kinds registered too."""

from arkvory.shared.cli.main import main
from tests import worker_kinds
from arkvory.writer.tasks.kinds import KINDS

KINDS.setdefault("steps", worker_kinds)
KINDS.setdefault("steps_b", worker_kinds)

if __name__ == "__main__":
    main()
