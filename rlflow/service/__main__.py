"""``python -m rlflow.service``: the Tinker-compatible service (rlflow.service.main)."""

from rlflow.service.main import main

if __name__ == "__main__":
    main()
