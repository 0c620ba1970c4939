"""The local queue files as a launch reads them, once (`LocalQueues`), and `launch --all`'s
connections begun from their headers the moment the project is loaded (`connect_planned`, from
`cli.launch`): at first contact each planned host's master and login shell
(`transport.connect_ahead`) are under way while the launch pipeline's modules (~0.1 s of imports)
and the controller lock's set-up load and run. The pipeline's own `connect_ahead` of the same hosts
then starts nothing more; what a connection raises is raised where the host is first used."""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.sweep.cells import QueueFile, Roster, build_roster, check_queue_name, read_all_queues, read_queue
from ablate.transport import connect_ahead

_Stamp = tuple[str, int, int, int]  # file name, inode, size, mtime_ns


def _stamps(project: Project) -> tuple[_Stamp, ...]:
    """What identifies each local queue file's content without reading it."""
    if not project.queues_dir.is_dir():
        return ()
    out = []
    for p in sorted(project.queues_dir.glob("*.txt")):
        try:
            st = p.stat()
        except OSError:  # gone since the listing: a change
            out.append((p.name, -1, -1, -1))
            continue
        out.append((p.name, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


@dataclass(frozen=True)
class LocalQueues:
    """The local queue files as read once, and their roster."""

    queues: tuple[QueueFile, ...]
    roster: Roster
    stamps: tuple[_Stamp, ...]

    @classmethod
    def read(cls, project: Project) -> LocalQueues:
        """Every local queue file (a bad one refuses, as `read_all_queues`) and the roster (a name
        collision refuses)."""
        stamps = _stamps(project)  # before the reads: a change between them shows as a change
        queues = tuple(read_all_queues(project))
        return cls(queues, build_roster(queues), stamps)

    def fresh(self, project: Project) -> LocalQueues:
        """These, or the files read again when any changed (or came or went) since."""
        return self if _stamps(project) == self.stamps else LocalQueues.read(project)

    def get(self, project: Project, name: str) -> QueueFile:
        """Queue `name`; refused as `read_queue` refuses a bad name or a missing file."""
        check_queue_name(name)
        found = next((q for q in self.queues if q.name == name), None)
        return found if found is not None else read_queue(project, name)


def connect_planned(project: Project) -> LocalQueues | None:
    """The local queue files, read once, and every host a `# ablate: host=` header names connecting
    from now on; None when the files do not read (`launch --all` reads them again and says why)."""
    try:
        local = LocalQueues.read(project)
    except AblateError:
        return None
    connect_ahead(project, [q.host for q in local.queues if q.host])
    return local
