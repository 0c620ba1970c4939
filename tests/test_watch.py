"""`ablate status --watch` and the live data behind it: driven through a real tmux pane against a
real running local sweep (rows appear and advance; q and Ctrl-C leave a clean terminal), the log
progress parser on typical trainers' lines, GPU parsing, and `status`'s plain / JSON forms."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.config.settings import DEFAULT_EPOCH_RE, DEFAULT_METRIC_RE
from ablate.monitor.hostinfo import REST, live_of, parse_gpus, parse_output, parse_progress
from ablate.monitor.status import status
from ablate.remote.host import probe
from tests.helpers.cli import Cli, ablate_cmd, ablate_process
from tests.helpers.project import LocalProject
from tests.helpers.tmux import Pane
from tests.helpers.wait import wait_for


@pytest.fixture
def pane_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)  # the queues' tmux socket, the test's HOME, NO_COLOR, COLUMNS
    env.pop("TMUX", None)
    env.pop("COLUMNS", None)  # the pane's own width
    return env


@pytest.fixture
def pane(pane_env: dict[str, str]) -> Iterator[Pane]:
    p = Pane(pane_env)
    try:
        yield p
    finally:
        p.close()


def sweep(cli: Cli, p: LocalProject, cells: int = 3, epochs: int = 3, step_time: float = 0.4) -> None:
    """Two queues (h1, h2) of `cells` real cells each, launched."""
    p.write_config(tasks={"recon": {"epochs": epochs, "cost_per_epoch": 1.0}})
    for q, host in (("q1", "h1"), ("q2", "h2")):
        names = [f"{q}c{i}" for i in range(cells)]
        for n in names:
            p.cfg(f"configs/{n}.yaml", step_time=step_time, seed=len(n))
        p.queue(q, [f"# ablate: host={host}", *(f"configs/{n}.yaml recon" for n in names)])
    assert cli(p, "-q", "launch", "--all").code == 0


ROW = re.compile(r"^(q[12])\s+(h[12])\s+(\S+)\s+\S+\s+(\d+)/(\d+)\s+(\S+)", re.MULTILINE)
DONE = "WATCH-EXIT="


def watch_command(root: Path, extra: str = "") -> str:
    # stty -g before and after: cbreak mode must be undone, whichever way the program leaves.
    return (f"before=$(stty -g); {extra}{ablate_cmd()} -C {root} status --watch --interval 0.3; rc=$?; "
            f'[ "$(stty -g)" = "$before" ] && s=same || s=changed; echo "{DONE}$rc STTY=$s"')


@pytest.mark.tmux
def test_watch_rows_appear_advance_and_q_leaves_a_clean_terminal(local_project: LocalProject,
                                                                  pane: Pane, cli: Cli) -> None:
    sweep(cli, local_project)
    pane.run(watch_command(local_project.root))
    seen: dict[str, set[int]] = {"q1": set(), "q2": set()}
    states: set[str] = set()
    progress: list[str] = []

    def advanced() -> bool:
        screen = pane.text()
        assert "Traceback" not in screen, screen
        for m in ROW.finditer(screen):
            seen[m.group(1)].add(int(m.group(4)))
            assert m.group(5) == "3"
            states.add(m.group(3))
        progress.extend(re.findall(r"ep \d/3 val_loss [\d.]+", screen))
        return all(len(ks) >= 2 for ks in seen.values()) and bool(progress)

    wait_for(advanced, timeout=60, interval=0.2)
    assert "running" in states  # rows are live, not a post-mortem
    assert all(max(ks) > min(ks) for ks in seen.values())  # k/n increased on each queue
    pane.keys("q")
    wait_for(lambda: f"{DONE}0 STTY=same" in pane.text(), timeout=15)
    screen = pane.text()
    assert "Traceback" not in screen and "ablate · sweep" not in screen  # the alternate screen is gone


@pytest.mark.tmux
def test_watch_ctrl_c_exits_130_without_a_traceback(local_project: LocalProject, pane: Pane,
                                                    cli: Cli) -> None:
    sweep(cli, local_project, cells=2, step_time=1.0)
    pane.run(watch_command(local_project.root))
    wait_for(lambda: ROW.search(pane.text()), timeout=30, interval=0.2)
    pane.keys("C-c")
    wait_for(lambda: DONE in pane.text().replace(f'"{DONE}', ""), timeout=15)
    screen = pane.text()
    assert f"{DONE}130 STTY=same" in screen, screen
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen


@pytest.mark.tmux
def test_watch_under_no_color_has_no_escape_codes_and_with_colour_has_them(
        local_project: LocalProject, pane: Pane, cli: Cli) -> None:
    sweep(cli, local_project, cells=2, step_time=1.0)
    sgr = re.compile(r"\x1b\[[0-9;]*m")
    pane.run("unset NO_COLOR; " + watch_command(local_project.root))
    wait_for(lambda: ROW.search(pane.text()), timeout=30, interval=0.2)
    coloured = pane.text(escapes=True)
    assert sgr.search(coloured), "a colour terminal should get colours (else the next check proves nothing)"
    pane.keys("q")
    wait_for(lambda: f"{DONE}0" in pane.text(), timeout=15)
    pane.run("clear; " + watch_command(local_project.root, extra="NO_COLOR=1 "))
    wait_for(lambda: ROW.search(pane.text()), timeout=30, interval=0.2)
    plain = pane.text(escapes=True)
    assert not sgr.search(plain), repr(plain[:400])
    pane.keys("q")
    wait_for(lambda: f"{DONE}0" in pane.text(), timeout=15)


@pytest.mark.tmux
def test_watch_without_a_terminal_prints_the_plain_table(local_project: LocalProject, cli: Cli) -> None:
    sweep(cli, local_project, cells=1, step_time=0.2)
    p = ablate_process(local_project, "status", "--watch", "--interval", "0.3")
    try:
        assert p.stdout is not None and p.stderr is not None
        first = [p.stdout.readline() for _ in range(3)]
        assert first[0].split()[:4] == ["QUEUE", "HOST", "STATE", "K/N"]
        assert {ln.split()[0] for ln in first[1:]} == {"q1", "q2"}
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=15) == 130
        assert "Traceback" not in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------- the live data


@pytest.mark.tmux
def test_status_live_reads_each_running_cells_progress_and_json_carries_it(
        local_project: LocalProject, cli: Cli) -> None:
    sweep(cli, local_project, cells=1, epochs=30, step_time=0.2)
    project = load_project(local_project.root)

    def progressing() -> object:
        rows = [r for r in status(project, live_info=True).rows if r.progress and r.progress["epoch"]]
        return rows if len(rows) == 2 else None

    rows = wait_for(progressing, timeout=30, interval=0.2)
    assert isinstance(rows, list)
    for r in rows:
        assert r.current == f"{r.queue}c0"
        assert r.progress["epochs"] == 30 and r.progress["metric"] == "val_loss"
        assert isinstance(r.progress["value"], float)
    assert status(project).rows[0].progress is None  # only when asked: one more command per host

    data = cli.json(local_project, "status")
    assert set(data["hosts"]) == {"h1", "h2"}
    if shutil.which("nvidia-smi") is None:
        assert all(h["gpus"] is None and h["error"] is None for h in data["hosts"].values())
    running = [q for q in data["queues"] if q["current"]]
    assert running and all(q["progress"]["metric"] == "val_loss" for q in running)

    code, out, _ = cli(local_project, "status")
    assert code == 0
    assert re.search(r"^progress q1 q1c0: ep \d+/30 val_loss ", out, re.MULTILINE), out


@pytest.mark.tmux
def test_status_reads_gpus_from_nvidia_smi_in_the_same_command(
        local_project: LocalProject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has no GPU: a stand-in nvidia-smi (the hardware boundary) prints what the real
    one prints for this query, so the one-command-per-host path is exercised end to end."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    'case "$*" in *--query-gpu=index,name,utilization.gpu,memory.used,memory.total*) ;; '
                    '*) echo "unexpected: $*" >&2; exit 9;; esac\n'
                    "echo '0, NVIDIA A100-SXM4-40GB, 87, 10240, 40960'\n"
                    "echo '1, NVIDIA A100-SXM4-40GB, [N/A], 3, 40960'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    local_project.queue("q1", ["# ablate: host=h1", "configs/a.yaml recon"])
    local_project.cfg("configs/a.yaml")
    report = status(load_project(local_project.root), live_info=True)
    gpus = report.hosts["h1"]["gpus"]
    assert [(g["index"], g["util"], g["mem_used"], g["mem_total"]) for g in gpus] == [
        (0, 87.0, 10240, 40960), (1, None, 3, 40960)]
    assert "gpus h1: GPU0 87% 10.0/40.0 GiB  GPU1 - 0.0/40.0 GiB" in report.lines()


def test_parse_gpus_keeps_what_nvidia_smi_said_when_it_fails() -> None:
    gpus, err = parse_gpus("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                           "driver. Make sure that the latest NVIDIA driver is installed and running.\n")
    assert gpus == [] and err is not None and "couldn't communicate" in err


def test_host_output_sections_split_cleanly() -> None:
    text = ("\x1eablate gpu\n0, T4, 5, 100, 15360\n"
            "\n\x1eablate log a\nepoch 1/2 loss=1\nepoch 2/2 loss=0.5"
            "\n\x1eablate log b\n\x1eablate missing\n")
    live = parse_output("h1", text)
    assert live.gpus is not None and live.gpus[0].name == "T4"
    assert live.tails == {"a": "epoch 1/2 loss=1\nepoch 2/2 loss=0.5"}
    assert live.missing == ["b"]


def test_host_output_carries_the_tmux_answer_status_reads_liveness_from() -> None:
    live = parse_output("h1", "\x1eablate tmux\nablate-s-h1-q1\nother\n\x1eablate tmuxrc 0\n"
                              "\x1eablate gpu\n0, T4, 5, 100, 15360\n")
    assert live.sessions == {"ablate-s-h1-q1", "other"} and live.gpus is not None
    none = parse_output("h1", "\x1eablate tmux\nno server running on /tmp/tmux-0/default\n"
                              "\x1eablate tmuxrc 1\n")
    assert none.sessions == set()  # no server: nothing runs, as `tmux_sessions` says
    broken = parse_output("h1", "\x1eablate tmux\nlost server\n\x1eablate tmuxrc 1\n")
    assert broken.sessions is None and "lost server" in (broken.tmux_error or "")


@pytest.mark.tmux
def test_status_asks_each_host_once_for_tmux_gpus_and_logs(local_project: LocalProject, tmux_socket: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from ablate.transport.local import LocalHost

    def refuse(self: LocalHost) -> set[str]:
        raise AssertionError("status asked tmux in a second round trip")

    local_project.queue("q1", [f"{local_project.cfg('configs/a.yaml')} recon 1"])
    monkeypatch.setattr(LocalHost, "tmux_sessions", refuse)
    report = status(load_project(local_project.root), live_info=True)
    assert [r.queue for r in report.rows] == ["q1"] and not report.unreachable


# What the usual trainers print; defaults must read the epoch and the main metric from each.
TRAINER_LINES = [
    ("plain print", "epoch 3/20 val_loss=0.12345", None, (3, 20, "val_loss", 0.12345)),
    ("plain bracketed", "Epoch [3/20], Loss: 0.2345", None, (3, 20, "Loss", 0.2345)),
    ("plain pipes", "Epoch 3 | train loss 0.52 | val acc 91.2%", None, (3, None, "val acc", 91.2)),
    ("plain sci", "[epoch 3] loss=1.2e-3", None, (3, None, "loss", 0.0012)),
    ("lightning tqdm",
     "Epoch 2: 100%|██████████| 63/63 [00:01<00:00, 45.32it/s, v_num=0, train_loss=0.123, "
     "val_loss=0.301, val_acc=0.912]", None, (2, None, "val_loss", 0.301)),
    ("lightning tqdm, main metric set",
     "Epoch 2: 100%|██████████| 63/63 [00:01<00:00, 45.32it/s, v_num=0, train_loss=0.123, "
     "val_loss=0.301, val_acc=0.912]", "val_acc", (2, None, "val_acc", 0.912)),
    ("lightning rich",
     "Epoch 3/19  ━━━━━━━━━━━━━━━━ 45/100 0:00:05 • 0:00:06 8.12it/s v_num: 0 train_loss: 0.234 "
     "val_loss: 0.301", None, (3, 19, "val_loss", 0.301)),
    ("hf trainer train", "{'loss': 0.4523, 'grad_norm': 2.13, 'learning_rate': 4.8e-05, 'epoch': 0.32}",
     None, (0.32, None, "loss", 0.4523)),
    ("hf trainer eval",
     "{'eval_loss': 0.3921, 'eval_accuracy': 0.8812, 'eval_runtime': 3.21, "
     "'eval_samples_per_second': 311.2, 'epoch': 1.0}", None, (1.0, None, "eval_loss", 0.3921)),
    ("hf trainer eval, metrics file says val_loss",
     "{'eval_accuracy': 0.8812, 'eval_loss': 0.3921, 'epoch': 1.0}", "val_loss",
     (1.0, None, "eval_loss", 0.3921)),
    ("keras", "Epoch 3/20\n100/100 [==============================] - 2s 20ms/step - loss: 0.2345 - "
     "accuracy: 0.9123 - val_loss: 0.3012 - val_accuracy: 0.8800", None, (3, 20, "val_loss", 0.3012)),
    ("mmengine", "Epoch(train)  [3][100/500]  lr: 1.0000e-04  eta: 0:10:00  loss: 0.5432", None,
     (3, None, "loss", 0.5432)),
]


@pytest.mark.parametrize(("line", "main_metric", "want"), [(c[1], c[2], c[3]) for c in TRAINER_LINES],
                         ids=[c[0] for c in TRAINER_LINES])
def test_default_progress_patterns_read_typical_trainer_lines(
        line: str, main_metric: str | None, want: tuple[float, int | None, str, float]) -> None:
    got = parse_progress(line, DEFAULT_EPOCH_RE, DEFAULT_METRIC_RE, main_metric)
    assert got is not None
    assert (got.epoch, got.epochs, got.metric, got.value) == want


def test_progress_uses_the_latest_update_of_a_carriage_return_bar_and_skips_ablate_lines() -> None:
    tail = ("# ablate 1.0 host=h1 queue=q1 cell=c resume=0 gpu=none\n"
            "Epoch 1: 10%|█| 1/10 [loss=0.9]\rEpoch 1: 50%|█| 5/10 [loss=0.5]\x1b[K\r"
            "Epoch 2: 90%|█| 9/10 [loss=0.25]\n# ablate end 2.0 rc=0\n")
    got = parse_progress(tail, DEFAULT_EPOCH_RE, DEFAULT_METRIC_RE)
    assert got is not None and (got.epoch, got.metric, got.value) == (2, "loss", 0.25)
    assert parse_progress("compiling kernels\nwarming up\n", DEFAULT_EPOCH_RE, DEFAULT_METRIC_RE) is None


def test_custom_patterns_from_ablate_yaml(local_project: LocalProject) -> None:
    local_project.write_config(monitor={"progress": {"epoch": r"it (\d+) of (\d+)",
                                                     "metric": r"(bleu)=(\d+\.\d+)"}})
    mon = load_project(local_project.root).monitor
    got = parse_progress("it 7 of 9 bleu=31.5 loss=2", mon.epoch_re, mon.metric_re)
    assert got is not None and (got.epoch, got.epochs, got.metric, got.value) == (7, 9, "bleu", 31.5)


def test_the_agents_probe_reads_gpus_and_logs_as_the_hosts_script_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a host's agent answers, `status` asks its probe (`mine` with `live`) instead of running
    the script; both read the same GPUs, tails and missing logs from the same host."""
    hb, ckpt, bindir = tmp_path / "heartbeats", tmp_path / "ckpt", tmp_path / "bin"
    for d in (hb, ckpt, bindir):
        d.mkdir()
    beats = {"h1.q1": {"host": "h1", "state": "running", "cell": "a"},
             "h1.q2": {"host": "h1", "state": "running", "cell": "gone"},
             "h1.q3": {"host": "h1", "state": "idle", "cell": "b"},
             "h1.q4": {"host": "h2", "state": "running", "cell": "c"}}
    for name, data in beats.items():
        (hb / name).write_text(json.dumps(data))
    (ckpt / "a.log").write_bytes(b"x" * 5000 + "epoch 3/10 loss 0.25 \u00e9\r".encode())
    for cell in ("b", "c"):
        (ckpt / f"{cell}.log").write_text("not running here\n")
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA A100, 87, 30000, 81920'\n"
                   "echo '1, NVIDIA A100, [N/A], 1, 81920'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    argv = ["bash", "-c", "root=$1; n=$2; hb=$3; me=$4; " + REST, "bash", str(ckpt), "1000", str(hb), "h1"]
    via_script = parse_output("h1", subprocess.run(argv, capture_output=True, check=True).stdout.decode(
        errors="replace"))

    heartbeats = {name: {"mtime": 0.0, "data": data} for name, data in sorted(beats.items())}
    shown = probe._live({"ckpt_root": str(ckpt), "bytes": 1000, "gpu_query": "q"}, heartbeats, "h1")
    via_probe = live_of("h1", shown)
    assert via_probe.gpus == via_script.gpus and len(via_probe.gpus or []) == 2
    assert (via_probe.gpu_error, via_probe.missing) == (via_script.gpu_error, via_script.missing)
    assert via_probe.missing == ["gone"] and via_probe.gpu_error is None
    assert via_probe.tails == via_script.tails and via_probe.tails["a"].endswith("loss 0.25 \u00e9\r")
    assert len(via_probe.tails["a"]) == 1000 - 1  # the last 1000 bytes; é is two of them


@pytest.mark.parametrize(("answers", "sessions"), [
    (["server exited unexpectedly", "no server running on /tmp/tmux-0/x"], set()),
    (["server exited unexpectedly", "=ablate-s-h1-q2"], {"ablate-s-h1-q2"}),
    (["server exited unexpectedly", "server exited unexpectedly"], None),
])
def test_tmux_asked_as_its_last_session_ends_is_asked_again_once(
        tmp_path: Path, answers: list[str], sessions: set[str] | None) -> None:
    """A host's tmux server exits when its last session (a drained queue) ends; a `list-sessions`
    that catches it exiting says "server exited unexpectedly". Asked again once, the host shows no
    server (nothing runs) or the sessions started since; only a server that keeps saying it is an
    error (e.g. a client of another tmux build)."""
    from ablate.sweep.hostview import tmux_answer
    from ablate.transport.shellhost import LIST_SESSIONS

    count = tmp_path / "count"
    fake = tmp_path / "tmux"
    script = f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n"
    for i, a in enumerate(answers):
        ok = a.startswith("=")
        script += f'[ "$n" = {i} ] && {{ echo "{a.lstrip("=")}"; exit {0 if ok else 1}; }}\n'
    fake.write_text("#!/bin/sh\n" + script + "exit 9\n")
    fake.chmod(0o755)
    r = subprocess.run(["sh", "-c", LIST_SESSIONS, "sh", str(fake)], capture_output=True, text=True)
    got, why = tmux_answer(r.stdout.splitlines(), str(r.returncode))
    assert got == sessions and count.read_text().strip() == "2"
    assert (why is None) == (sessions is not None)
