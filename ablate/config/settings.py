"""The optional sections of `ablate.yaml` beyond the core: cost overrides, monitoring thresholds
and log-progress patterns, the report's baseline, main metric and grouping over seeds, work
stealing, calibration, autostop; and the durations and sizes the config writes.

Each parser takes the `Reader` of the top level (`ablate.config.reader`) and returns a frozen
dataclass with defaults (autostop: None, off), so a project without these sections behaves as
documented.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ablate.config.reader import Reader, check_template
from ablate.errors import ConfigError
from ablate.remote.host.autostop import Settings

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_DUR_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SAFE_GLOB = re.compile(r"^[A-Za-z0-9._/+@,=*?\[\]-]+$")
_KEY_PATH = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")  # `seed`, `train.seed`: dots separate nested keys
_GROUP_OFF = ("none", "off")

# Defaults that match the usual trainers' lines (tests/test_watch.py has them): plain prints
# ("Epoch 3/20", "epoch: 3", "[epoch 3]", "val_loss=0.123", "loss: 1.2e-3"), PyTorch Lightning's
# progress bars ("Epoch 2: 100%|...| v_num=0, train_loss=0.12, val_loss=0.3"), HF Trainer's dicts
# ("{'eval_loss': 0.39, 'epoch': 1.0}"), Keras ("- val_accuracy: 0.88") and mmengine
# ("Epoch(train) [3][100/500]"). Group 1 of `epoch` is the epoch (may be fractional), group 2
# (optional) the total; group 1 of `metric` is the metric's name, group 2 its value.
DEFAULT_EPOCH_RE = r"(?i)\bepoch\b(?:\(\w+\))?['\"]?[\s:=#\[]*(\d+(?:\.\d+)?)(?:\s*(?:/|of)\s*(\d+))?"
DEFAULT_METRIC_RE = (r"(?i)\b((?:(?:eval|val|valid|validation|test|train)[_/ ]?)?"
                     r"(?:loss|acc(?:uracy)?|f1|map|miou|bleu|psnr|ssim|auc|top1|top5|perplexity|ppl))"
                     r"\b['\"]?\s*[:=]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)")


@dataclass(frozen=True)
class CostOverride:
    """`costs: [{glob, cost | cost_per_epoch}]`: the first entry whose glob matches a cell's cfg
    path (relative to the repo root, `**` crossing directories) sets its declared cost."""

    glob: str
    cost: float | None  # the whole cell's cost
    cost_per_epoch: float | None  # or per epoch, times the cell's epochs


@dataclass(frozen=True)
class Monitor:
    hung_after: float  # seconds a running cell's log may stay silent before it is `hung`
    idle_after: float  # seconds a host may sit with all its queues drained before the alarm
    epoch_re: str  # log progress patterns (see DEFAULT_*_RE for the groups)
    metric_re: str
    # seconds a cell that is stopped (`ablate stop`, a dead service) has from its TERM to save and
    # exit before its KILL: top-level `stop_grace` (Slurm's own signals bring the site's window)
    stop_grace: float = 120.0


@dataclass(frozen=True)
class ReportSettings:
    baseline: tuple[str, ...]  # cell-name globs (or cfg-path globs) that mark a task's baseline
    metric: str | None  # the main metric (a key of the metrics file); None: first metrics_keys
    goal: str  # "min" or "max": which direction is better for `metric`
    # The config key that holds the seed (dotted for a nested one): cells of a task whose configs
    # differ only in it are one row of the table over seeds; a config without it groups by the
    # name's _seed<k> / _s<k> suffix. None (`group_by: none`): every cell is its own row.
    group_by: str | None = "seed"


DEFAULT_MONITOR = Monitor(1800.0, 1200.0, DEFAULT_EPOCH_RE, DEFAULT_METRIC_RE)
DEFAULT_REPORT = ReportSettings(("*baseline*", "*base", "*_base_*", "*-base-*"), None, "min")


def parse_duration(value: Any, where: str, *, zero: bool = False) -> float:
    """`30m`, `1.5h`, `90s`, `2d` or a number of seconds; `zero`: 0 is a duration too."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a duration like 30m or 90s, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            what = "a non-negative" if zero else "a positive"
            raise ConfigError(f"{where}: a duration must be {what} number of seconds, got {value!r}")
        return float(value)
    m = _DURATION.match(str(value))
    if not m or (float(m.group(1)) == 0 and not zero):
        raise ConfigError(f"{where}: expected a duration like 30m, 1.5h or 90s, got {value!r}")
    return float(m.group(1)) * _DUR_UNITS[(m.group(2) or "").lower()]


def parse_size(value: Any, where: str) -> int:
    """`2GB`, `500MB`, `1.5GiB` or a number of bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a size like 2GB, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: size must be a finite, non-negative number, got {value!r}")
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ConfigError(f"{where}: expected a size like 2GB or 500MB, got {value!r}")
    unit = (m.group(2) or "").upper()
    binary = "I" in unit
    letter = unit[:1] if unit[:1] in "KMGT" else ""
    mult = _SIZE_UNITS[letter] if not binary else 1024 ** "_KMGT".index(letter)
    return int(float(m.group(1)) * mult)


def _regex(value: Any, where: str, groups: int) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be a regular expression string, got {value!r}")
    try:
        rx = re.compile(value)
    except re.error as e:
        raise ConfigError(f"{where}: not a valid regular expression ({e}); quote it in single "
                          "quotes in YAML so backslashes survive") from None
    if rx.groups < groups:
        raise ConfigError(f"{where}: needs at least {groups} capture group(s), has {rx.groups}")
    return value


def parse_costs(r: Reader, tasks: Mapping[str, object]) -> tuple[CostOverride, ...]:
    raw = r.data.get("costs") or []
    if not isinstance(raw, list):
        raise r.err("costs", "must be a list of {glob, cost} or {glob, cost_per_epoch}")
    out = []
    for i, item in enumerate(raw):
        c = Reader(item, r.file, f"costs[{i}]", {"glob", "cost", "cost_per_epoch"})
        glob = c.text("glob", required=True) or ""
        if glob.startswith("/") or not _SAFE_GLOB.match(glob):
            raise c.err("glob", f"{glob!r} must be a relative glob of plain characters and * ? [ ]")
        if c.has("cost") == c.has("cost_per_epoch"):
            raise c.err("cost", "give exactly one of cost (the whole cell) or cost_per_epoch")
        cost = c.num("cost", 1.0) if c.has("cost") else None
        per = c.num("cost_per_epoch", 1.0) if c.has("cost_per_epoch") else None
        out.append(CostOverride(glob, cost, per))
    return tuple(out)


def parse_monitor(r: Reader) -> Monitor:
    m = r.sub("monitor", {"hung_after", "idle_after", "progress"})
    where = f"{r.file}: monitor"
    hung = parse_duration(m.data["hung_after"], f"{where}.hung_after") if m.has("hung_after") \
        else DEFAULT_MONITOR.hung_after
    idle = parse_duration(m.data["idle_after"], f"{where}.idle_after") if m.has("idle_after") \
        else DEFAULT_MONITOR.idle_after
    p = m.sub("progress", {"epoch", "metric"})
    epoch = _regex(p.data["epoch"], f"{where}.progress.epoch", 1) if p.has("epoch") \
        else DEFAULT_EPOCH_RE
    metric = _regex(p.data["metric"], f"{where}.progress.metric", 2) if p.has("metric") \
        else DEFAULT_METRIC_RE
    grace = parse_duration(r.data["stop_grace"], f"{r.file}: stop_grace") if r.has("stop_grace") \
        else DEFAULT_MONITOR.stop_grace
    return Monitor(hung, idle, epoch, metric, grace)


def parse_report(r: Reader, metrics_keys: tuple[str, ...]) -> ReportSettings:
    s = r.sub("report", {"baseline", "metric", "goal", "group_by"})
    baseline = s.data.get("baseline")
    if baseline is None:
        globs = DEFAULT_REPORT.baseline
    elif isinstance(baseline, str) and baseline:
        globs = (baseline,)
    elif isinstance(baseline, list) and baseline and all(isinstance(b, str) and b for b in baseline):
        globs = tuple(baseline)
    else:
        raise s.err("baseline", f"must be a cell-name glob or a list of them, got {baseline!r}")
    metric = s.text("metric")
    if metric is None and metrics_keys:
        metric = metrics_keys[0]
    goal = s.text("goal", "min") or "min"
    if goal not in ("min", "max"):
        raise s.err("goal", f"must be min or max (is a lower {metric or 'metric'} better?), got {goal!r}")
    return ReportSettings(globs, metric, goal, _group_by(s))


def _group_by(s: Reader) -> str | None:
    v = s.data.get("group_by")
    if v is None:
        return DEFAULT_REPORT.group_by
    if v is False or (isinstance(v, str) and v.strip().lower() in _GROUP_OFF):
        return None
    if isinstance(v, str) and _KEY_PATH.match(v):
        return v
    raise s.err("group_by", f"must be the config key that holds the seed (seed, or train.seed for a "
                            f"nested key), or none to give every cell its own row; got {v!r}")


def parse_steal(r: Reader) -> bool:
    v = r.data.get("steal", True)
    if not isinstance(v, bool):
        raise r.err("steal", f"must be true or false, got {v!r}")
    return v


@dataclass(frozen=True)
class Calibrate:
    """`calibrate:` (docs/ARCHITECTURE.md, "Calibration"): a short benchmark each queue times once per
    host before its first cell; the head deal uses the measured speeds instead of the declared ones."""

    command: str = ""  # empty: no calibration
    timeout: int = 600  # seconds; a benchmark still running then is killed (the declared speed counts)
    keep: bool = True  # the measurement is kept for the next sweeps on the same machine


def parse_calibrate(r: Reader) -> Calibrate:
    v = r.data.get("calibrate")
    if v is None:
        return Calibrate()
    keep = True
    if isinstance(v, dict):
        c, key = r.sub("calibrate", {"command", "timeout", "keep"}), "command"
        timeout = c.whole("timeout", 600) or 600
        keep = c.data.get("keep", True)
        if not isinstance(keep, bool):
            raise c.err("keep", f"must be true or false (false: measure again at every sweep), got {keep!r}")
    elif isinstance(v, str):
        c, key, timeout = r, "calibrate", 600
    else:
        raise r.err("calibrate", f"must be a command, or a mapping with command, timeout and keep; got {v!r}")
    command = (c.text(key, required=True) or "").strip()
    if "\n" in command:
        raise c.err(key, "spans several lines; write one command (YAML `>-` folds a long one onto one line)")
    check_template(command, {"gpu"}, c, key)
    return Calibrate(command, timeout, keep)


NO_CALIBRATE = Calibrate()


# `autostop: {idle, command, keep}` (docs/configuration.md, "Stopping idle instances"): the watcher's
# own settings type (ablate/remote/host/autostop.py), one definition for both sides. None: off.
Autostop = Settings


AUTOSTOP_EXAMPLE = 'autostop: {idle: 10m, command: "runpodctl stop pod $RUNPOD_POD_ID"}'


def parse_autostop(r: Reader) -> Autostop | None:
    """`autostop:` of ablate.yaml's top level or of a profile (`r` is that file's top level)."""
    v = r.data.get("autostop")
    if v is None or v is False:
        return None
    if not isinstance(v, dict):
        raise r.err("autostop", f"must be a mapping with idle and command (and keep), or false (off); "
                                f"got {v!r}; e.g. {AUTOSTOP_EXAMPLE}")
    a = r.sub("autostop", {"idle", "command", "keep"})
    if not a.has("idle"):
        raise a.err("idle", "is required: how long an instance with nothing left to do waits before it "
                            "stops itself, e.g. idle: 10m (0: at once)")
    idle = parse_duration(a.data["idle"], f"{r.file}: autostop.idle", zero=True)
    if not a.has("command"):
        raise a.err("command", "is required: the command that stops this instance from inside it, run "
                               "through sh -c there, e.g. command: runpodctl stop pod $RUNPOD_POD_ID "
                               "(the shipped profiles have one for their platform)")
    command = (a.text("command") or "").strip()
    keep = a.data.get("keep")
    if keep is None:
        keep = 1
    elif isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise a.err("keep", f"must be a whole number >= 0 (instances kept up while cells wait for "
                            f"`ablate remediate`; 0: none), got {keep!r}")
    return Autostop(idle, command, keep)
