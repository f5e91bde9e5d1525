"""rlflow."""
