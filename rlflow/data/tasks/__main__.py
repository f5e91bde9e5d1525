"""``python -m rlflow.data.tasks --task NAME ...``: the same command as ``rlflow-data task NAME ...``."""

import sys

from rlflow.data.cli import tasks_module_main

if __name__ == "__main__":
    sys.exit(tasks_module_main())
