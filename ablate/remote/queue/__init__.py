"""The runner: what run_queue and run_one ask, answered in Python (docs/ARCHITECTURE.md, "run_queue")."""
