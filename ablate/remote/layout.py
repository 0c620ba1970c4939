"""Where things live on the shared FS under one sweep root: `<shared_fs>/ablate/<sweep>/`.

The one source of these paths for the controller and for the probe that runs on the hosts (this
module is shipped with it, content-addressed, so the two cannot drift). Pure path arithmetic on
POSIX strings (the root may be a remote path), stdlib only, no I/O. The formats are described in
docs/ARCHITECTURE.md; the bash wrappers build the same paths (they cannot import this).
"""

from __future__ import annotations

import posixpath

MANIFEST = "MANIFEST.json"
STAGING_PREFIX = ".staging."  # final_ckpts/.staging.<name>.<host>.<pid>/: a copy in flight
ASIDE_PREFIX = ".aside."  # final_ckpts/.aside.<name>.<t>[.staging-<k>]/: set aside by remediate


class SweepLayout:
    """The paths of one sweep root. Immutable, compared and hashed by its root (a plain class, not a
    dataclass: `dataclasses` costs the probe ~15 ms of imports at every start on every host)."""

    __slots__ = ("root",)
    root: str

    def __init__(self, root: str) -> None:
        object.__setattr__(self, "root", root)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"SweepLayout is immutable (setting {name!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SweepLayout) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def __repr__(self) -> str:
        return f"SweepLayout(root={self.root!r})"

    def _j(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # ------------------------------------------------------------------ directories

    @property
    def wrappers(self) -> str:
        return self._j("wrappers")

    @property
    def specs(self) -> str:
        return self._j("specs")

    @property
    def queues(self) -> str:
        return self._j("queues")

    @property
    def slurm(self) -> str:
        """Each Slurm queue job's output, `<job name>.out` (appended across its requeues)."""
        return self._j("slurm")

    @property
    def claims(self) -> str:
        return self._j("claims")

    @property
    def events(self) -> str:
        return self._j("events")

    @property
    def heartbeats(self) -> str:
        return self._j("heartbeats")

    @property
    def final(self) -> str:
        return self._j("final_ckpts")

    @property
    def tails(self) -> str:
        """`tails/<name>.log`: the last lines of a cell that failed (run_queue)."""
        return self._j("tails")

    @property
    def released(self) -> str:
        """`released/<name>.<t>/`: claims remediate released (renamed, never deleted)."""
        return self._j("released")

    @property
    def control(self) -> str:
        return self._j("control")

    @property
    def gate(self) -> str:
        return self._j("gate")

    @property
    def remediation(self) -> str:
        return self._j("remediation")

    @property
    def locks(self) -> str:
        return self._j("locks")

    @property
    def lib(self) -> str:
        """Content-addressed copies of the host-side package `ablate.remote` (the probe)."""
        return self._j("lib")

    # ------------------------------------------------------------------ files

    def queue_file(self, queue: str) -> str:
        return self._j("queues", f"{queue}.txt")

    def ledger(self, queue: str) -> str:
        return self._j("queues", f"{queue}.ledger")

    def claim(self, name: str) -> str:
        return self._j("claims", name)

    def claim_owner(self, name: str) -> str:
        return self._j("claims", name, "owner")

    def events_file(self, host: str, queue: str) -> str:
        return self._j("events", f"{host}.{queue}.jsonl")

    def heartbeat(self, host: str, queue: str) -> str:
        return self._j("heartbeats", f"{host}.{queue}")

    def final_dir(self, name: str) -> str:
        return self._j("final_ckpts", name)

    def manifest(self, name: str) -> str:
        return self._j("final_ckpts", name, MANIFEST)

    def aside_dir(self, name: str, t: str, staging: int | None = None) -> str:
        suffix = "" if staging is None else f".staging-{staging}"
        return self._j("final_ckpts", f"{ASIDE_PREFIX}{name}.{t}{suffix}")

    def tail(self, name: str) -> str:
        return self._j("tails", f"{name}.log")

    def released_claim(self, name: str, t: str) -> str:
        return self._j("released", f"{name}.{t}")

    def stop_request(self, host: str, queue: str) -> str:
        """`control/<host>.<queue>.stop`: `ablate stop --after-current` asks run_queue to end after
        its current cell; a launch of that queue removes it first."""
        return self._j("control", f"{host}.{queue}.stop")

    def wrapper(self, kind: str, version: str) -> str:
        return self._j("wrappers", f"{kind}.{version}.sh")

    def spec(self, version: str) -> str:
        return self._j("specs", f"{version}.env")

    @property
    def deployed(self) -> str:
        """JSON naming the current wrapper version and the spec of each host (atomic replace)."""
        return self._j("DEPLOYED.json")

    @property
    def estimates(self) -> str:
        """`estimates.tsv`: what a draining runner steals by (ablate.plan.cost)."""
        return self._j("estimates.tsv")

    @property
    def clock(self) -> str:
        """The probe's FS-clock file: touched, then its mtime read (hosts' clocks disagree)."""
        return self._j(".clock")

    @property
    def reconcile_record(self) -> str:
        return self._j("gate", "reconcile.json")

    @property
    def fs_lag(self) -> str:
        """`gate/fslag.json`: the FS's visibility lag between hosts, as `ablate doctor` measured it."""
        return self._j("gate", "fslag.json")

    def release_record(self, host: str) -> str:
        return self._j("gate", f"release.{host}.json")

    def remediation_record(self, t: str) -> str:
        return self._j("remediation", f"{t}.json")

    @property
    def lock_file(self) -> str:
        """The controller lock (flock(2) on this file; ablate.sweep.lock)."""
        return self._j("locks", "controller.lock")

    @property
    def lock_holder(self) -> str:
        return self._j("locks", "controller.holder")

    def lib_dir(self, digest: str) -> str:
        return self._j("lib", digest)


RELEASE_PREFIX, RELEASE_SUFFIX = "release.", ".json"  # gate/release.<host>.json


def session_name(sweep: str, host: str, queue: str) -> str:
    """tmux session of one queue on one host. tmux forbids '.' and ':' in names."""
    raw = f"ablate-{sweep}-{host}-{queue}"
    return raw.replace(".", "_").replace(":", "_")
