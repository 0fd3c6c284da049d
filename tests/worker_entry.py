"""`arkvory worker` (and every other `arkvory` command) with the test kinds registered too."""

from shared.cli import main
from tests import worker_kinds
from writer.tasks.kinds import KINDS

KINDS.setdefault("steps", worker_kinds)
KINDS.setdefault("steps_b", worker_kinds)

if __name__ == "__main__":
    main()
