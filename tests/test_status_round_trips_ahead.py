"""`ablate status` sends its round trips (each host's query, the FS's snapshot probe) as soon as the
project is loaded, before it imports what reads their answers (`ablate.monitor.ahead`): what was
started is handed to that status alone, and what a round trip raised is raised where it is read."""

from __future__ import annotations

import pytest

from ablate.config.project import load_project
from ablate.errors import AblateError, FSError
from ablate.monitor import ahead
from ablate.monitor.status import status
from ablate.transport import shared_fs
from tests.helpers.project import LocalProject


def test_start_sends_every_hosts_query_and_the_probe(local_project: LocalProject) -> None:
    project = load_project(local_project.root)
    started = ahead.start(project)
    assert started is not None and set(started.asking) == set(project.hosts)
    assert "heartbeats" in started.snapshot()  # the probe's answer, as `fs.probe` gives it
    assert ahead.start(project, trips=False) is None  # `--watch`: only `ssh -G` ahead


def test_status_reads_what_was_sent_for_it(local_project: LocalProject,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    project = load_project(local_project.root)
    fs = shared_fs(project)

    def broken(self: object, op: str, args: object) -> object:
        raise FSError("local", f"probe {op}", "/x", "the FS did not answer")

    monkeypatch.setattr(type(fs), "probe", broken)
    sent = ahead.start(project)  # raises nothing here
    monkeypatch.undo()
    assert sent is not None
    with pytest.raises(FSError, match="did not answer"):  # its answer, not one of its own
        status(project, live_info=True, sent=sent)
    assert status(project, live_info=True).sweep == project.sweep  # none given: sent now


def test_a_project_whose_fs_cannot_be_opened_starts_nothing(local_project: LocalProject,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    project = load_project(local_project.root)

    def refuse(*a: object, **k: object) -> object:
        raise AblateError("no FS here")

    monkeypatch.setattr(ahead, "shared_fs", refuse)
    assert ahead.start(project) is None
