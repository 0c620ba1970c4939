"""`ablate status` sends its round trips (each host's query, the FS's snapshot probe) as soon as the
project is loaded, before it imports what reads their answers (`ablate.monitor.ahead`): what was
started is handed to the status that follows once, and what a round trip raised is raised there."""

from __future__ import annotations

import pytest

from ablate.config.project import load_project
from ablate.errors import AblateError, FSError
from ablate.monitor import ahead
from ablate.transport import shared_fs
from tests.helpers.project import LocalProject


def test_what_was_started_is_handed_over_once(local_project: LocalProject) -> None:
    project = load_project(local_project.root)
    fs = shared_fs(project)
    ahead.start(project)
    first = ahead.take(project, fs, live_info=True)
    assert set(first.asking) == set(project.hosts)
    assert "heartbeats" in first.snapshot()  # the probe's answer, as `fs.probe` gives it
    again = ahead.take(project, fs, live_info=True)  # nothing left over: started now
    assert again is not first and again.asking is not first.asking
    assert "heartbeats" in again.snapshot()


def test_started_for_one_kind_of_status_is_not_taken_by_another(local_project: LocalProject) -> None:
    project = load_project(local_project.root)
    fs = shared_fs(project)
    ahead.start(project)
    plain = ahead.take(project, fs, live_info=False)
    live = ahead.take(project, fs, live_info=True)
    assert plain is not live
    assert ahead.take(project, fs, live_info=True) is not live


def test_a_probe_that_fails_raises_where_its_answer_is_read(local_project: LocalProject,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    project = load_project(local_project.root)
    fs = shared_fs(project)

    def broken(self: object, op: str, args: object) -> object:
        raise FSError("local", f"probe {op}", "/x", "the FS did not answer")

    monkeypatch.setattr(type(fs), "probe", broken)
    ahead.start(project)  # raises nothing here
    started = ahead.take(project, fs, live_info=True)
    with pytest.raises(FSError, match="did not answer"):
        started.snapshot()


def test_a_project_whose_fs_cannot_be_opened_starts_nothing(local_project: LocalProject,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    project = load_project(local_project.root)

    def refuse(*a: object, **k: object) -> object:
        raise AblateError("no FS here")

    monkeypatch.setattr(ahead, "shared_fs", refuse)
    ahead.start(project)
    assert not ahead._STARTED
