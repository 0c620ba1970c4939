"""Commands that start and stop work on the hosts: `deploy`, `launch`, `append`, `stop`, and the
preflight `doctor` (with the batched host checks of `hostcheck`).
"""
