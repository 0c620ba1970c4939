"""Whether the deployed wrappers and run spec a host's next launch uses are there, as that host sees
the shared FS, and intact (their sha256 is their content address): `ablate doctor`'s `deployed`.

A storage host mounts no shared FS: its launch fetches those files from the store into its own
copy of the sweep (ablate/run/store_launch.py). For it the store's copies are checked (read here, from
the controller), and its own copies only noted: one missing is fetched at its next launch, one
damaged is fetched again then."""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from ablate.config.project import Host, Project
from ablate.remote.store.client import Store, StoreError
from ablate.run.host_measure import Section
from ablate.run.placement import packaged_runner, packaged_wrappers


def deployed_files(deployed: dict[str, Any] | None, host: str) -> list[str]:
    """Paths (relative to the sweep root) DEPLOYED.json says new launches on `host` use."""
    if not deployed:
        return []
    files = [f"wrappers/{deployed[k]}" for k in ("run_queue", "run_one", "runner")
             if isinstance(deployed.get(k), str)]
    spec = (deployed.get("specs") or {}).get(host)
    if isinstance(spec, str):
        files.append(f"specs/{spec}")
    return files


def expected_sha(rel: str) -> str:
    """The content address in a deployed file's name (`run_one.<sha12>.sh`, `runner.<sha12>.pyz`,
    `<sha12>.env`), or the full sha256 when it is this package's own wrapper or runner zipapp."""
    own = {**{f"{kind}.{{}}.sh": data for kind, data in packaged_wrappers().items()},
           "runner.{}.pyz": packaged_runner()}
    for name, data in own.items():
        full = hashlib.sha256(data).hexdigest()
        if rel == f"wrappers/{name.format(full[:12])}":
            return full
    base = posixpath.basename(rel)
    named = base.startswith(("run_queue.", "run_one.", "learn.", "runner."))
    return base.split(".")[-2] if named else base.split(".")[0]


def deployed_check(project: Project, host: Host, deployed: dict[str, Any] | None, fs_error: str | None,
                   sec: Section | None) -> tuple[str, bool, str]:
    if fs_error:
        return ("deployed", False, f"cannot read DEPLOYED.json: {fs_error}")
    if not deployed:
        return ("deployed", True, "not deployed yet (`ablate deploy` or the first launch places it)")
    version = deployed.get("version")
    files = deployed_files(deployed, host.name)
    seen: dict[str, str] = {}
    for line in (sec.out if sec else "").splitlines():
        digest, _, path = line.partition("  ")
        if len(digest) == 64:
            seen[posixpath.relpath(path, project.sweep_root(host))] = digest
    store = project.sweep_store(host)
    if store is not None:
        return _store_host(host, store, version, files, seen)
    for rel in files:
        if rel not in seen:
            return ("deployed", False, f"version {version}: {rel} is missing under "
                                    f"{project.sweep_root(host)} on {host.name}")
        if not seen[rel].startswith(expected_sha(rel)):
            return ("deployed", False, f"version {version}: {rel} has sha256 {seen[rel][:12]} there, "
                                    "not its content address: the copy is damaged")
    if not any(f.startswith("specs/") for f in files):
        return ("deployed", True, f"version {version} visible; no run spec for {host.name} yet "
                                  "(the next deploy or launch writes it)")
    return ("deployed", True, f"version {version} visible, sha256 matches ({len(files)} files)")


def _store_host(host: Host, store: tuple[str, str | None], version: object, files: list[str],
                seen: dict[str, str]) -> tuple[str, bool, str]:
    """A storage host's `deployed`: the store's copies intact; the host's own copies (`seen`: their
    sha256 there) only noted."""
    try:
        s = Store(store[0], store[1], wait=10.0, attempts=2)
        for rel in files:
            got = s.get(rel)
            if got is None:
                return ("deployed", False, f"version {version}: {rel} is missing in the store "
                                           f"{s.where(rel)}; deploy again (`ablate deploy`)")
            have = hashlib.sha256(got.data).hexdigest()
            if not have.startswith(expected_sha(rel)):
                return ("deployed", False, f"version {version}: {s.where(rel)} has sha256 {have[:12]}, not "
                                           "its content address: the store's copy is damaged; deploy again")
    except StoreError as e:
        return ("deployed", False, f"cannot read the deployed files from the store: {e}")
    here = [rel for rel in files if rel in seen and seen[rel].startswith(expected_sha(rel))]
    damaged = [rel for rel in files if rel in seen and rel not in here]
    note = f"{len(here)} of {len(files)} already in {host.name}'s own copy"
    if len(here) < len(files):
        note += ", the others fetched at its next launch"
    if damaged:
        note += f" ({', '.join(damaged)} damaged there: fetched again then)"
    if not any(f.startswith("specs/") for f in files):
        note += f"; no run spec for {host.name} yet (the next deploy or launch writes it)"
    return ("deployed", True, f"version {version} in the store, sha256 matches ({len(files)} files); {note}")
