"""Commands that start and stop work on the hosts: `deploy`, `launch`, `append`, `stop`, and the
batched host measurements (`host_measure`) they and `doctor` share.
"""
