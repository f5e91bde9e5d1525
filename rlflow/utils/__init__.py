"""Small shared utilities: device selection, seeding, logging, timers."""
