"""Numbers the controller and the runner share, each defined here once. Stdlib only (in the runner's
zipapp). `ablate deploy` writes them into every run spec (`ablate/run/placement.py`), so the
wrappers read them there and keep no copy of their own; the runner falls back to them when it runs
alone (tests, by hand).
"""

from __future__ import annotations

HEARTBEAT_SECS = 10  # `heartbeat_secs:`: seconds between a queue's heartbeats

# Seconds run_queue retries a claim whose directory has no owner before it takes the claim over: on
# a network FS a client's cache may still show a claim remediate released, for the FS's lag. Above
# the longest cache a default mount keeps (NFS's acdirmax, sshfs or FUSE set to 60 s), with margin,
# as doctor's cap (`ablate/doctor/fs_lag.py`): at 60 s, a released claim could still look present when
# the wait ended, the takeover wrote into a directory the server no longer had, and the cell was
# skipped. `ablate/sweep/classify.py` counts an ownerless claim `queued` meanwhile.
CLAIM_WAIT = 150
