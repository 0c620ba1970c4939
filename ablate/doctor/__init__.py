"""`ablate doctor`, the preflight: every check it runs, in one place. `command` runs them per host
and renders the report; each other module is one kind of check (the hosts' services, the deployed
files, the shared FS's lag, the object store, the Slurm cluster and its probe job).
"""
