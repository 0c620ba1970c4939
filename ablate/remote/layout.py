"""Where things live on the shared FS under one sweep root: `<shared_fs>/ablate/<sweep>/`.

Pure path arithmetic on POSIX strings (the root may be a remote path), no I/O.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass


@dataclass(frozen=True)
class SweepLayout:
    root: str

    def _j(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

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
    def gate(self) -> str:
        return self._j("gate")

    @property
    def lib(self) -> str:
        """Content-addressed copies of the stdlib-only verification code (for hosts)."""
        return self._j("lib")

    @property
    def lock(self) -> str:
        return self._j(".lock")

    def queue_file(self, queue: str) -> str:
        return self._j("queues", f"{queue}.txt")

    def ledger(self, queue: str) -> str:
        return self._j("queues", f"{queue}.ledger")

    def claim(self, name: str) -> str:
        return self._j("claims", name)

    def events_file(self, host: str, queue: str) -> str:
        return self._j("events", f"{host}.{queue}.jsonl")

    def heartbeat(self, host: str, queue: str) -> str:
        return self._j("heartbeats", f"{host}.{queue}")

    def final_dir(self, name: str) -> str:
        return self._j("final_ckpts", name)

    def wrapper(self, kind: str, version: str) -> str:
        return self._j("wrappers", f"{kind}.{version}.sh")

    def spec(self, version: str) -> str:
        return self._j("specs", f"{version}.env")

    @property
    def deployed(self) -> str:
        """JSON naming the current wrapper version and the spec of each host (atomic replace)."""
        return self._j("DEPLOYED.json")

    @property
    def reconcile_record(self) -> str:
        return self._j("gate", "reconcile.json")

    def release_record(self, host: str) -> str:
        return self._j("gate", f"release.{host}.json")


def session_name(sweep: str, host: str, queue: str) -> str:
    """tmux session of one queue on one host. tmux forbids '.' and ':' in names."""
    raw = f"ablate-{sweep}-{host}-{queue}"
    return raw.replace(".", "_").replace(":", "_")
