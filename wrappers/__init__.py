"""The bash wrappers (run_queue.sh, run_one.sh), shipped as package data of ablate.wrappers."""
