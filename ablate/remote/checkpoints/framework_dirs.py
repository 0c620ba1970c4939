"""The directories the frameworks write, checked for completeness over a result's recorded files.
Stdlib only.

Each file of a checkpoint is checked on its own (`ablate.remote.checkpoints.filecheck`); these are the checks
across files, over the checkpoint files MANIFEST.json records (relative paths; a file that is not
recorded is not in the result, whatever the disk holds):

  DeepSpeed     `latest` names a tag (`global_stepN`) that must be in the result; a tag directory
                holds `mp_rank_*_model_states.pt`, and its ZeRO optimizer shards
                `*zero_pp_rank_<r>_mp_rank_<m>_optim_states.pt` for every data-parallel rank r below
                the `dp_world_size` its model states record (read by stubs, never run)
  DCP           every file a `.metadata` names (its storage_data) recorded and at least
                offset + length bytes; every `*.distcp` beside a recorded `.metadata`
  HF Trainer    `checkpoint-N/trainer_state.json` beside model weights, its `global_step` N
  accelerate    `random_states_<i>.pkl`, `model_<i>.*`, `optimizer_<i>.bin`: no index skipped
  PEFT          `adapter_config.json` beside `adapter_model.safetensors` (or `.bin`)
(A Hugging Face `*.index.json`'s shards: `ablate.remote.checkpoints.verify`.)
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import zipfile
from collections import defaultdict

from ablate.remote.checkpoints import filecheck, pickles, torchzip

Problem = dict[str, str]
MODEL_STATES = "mp_rank_*_model_states.pt"
ZERO = re.compile(r"(?:.*_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")
TAG = re.compile(r"[A-Za-z0-9_.-]+")
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin")
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# accelerate's save_state: the first of each is unnumbered, the next `<stem>_1`, `<stem>_2`, ...
NUMBERED = re.compile(r"(random_states|model|optimizer|scheduler|sampler)(?:_(\d+))?\.(pkl|safetensors|bin)")


def _problem(file: str, kind: str, error: str) -> Problem:
    return {"file": file, "kind": kind, "error": error}


def coverage(path: str, files: list[str]) -> list[Problem]:
    """Every problem across the recorded checkpoint `files` of the result dir `path`."""
    by_dir: dict[str, set[str]] = defaultdict(set)
    for f in files:
        by_dir[posixpath.dirname(f)].add(posixpath.basename(f))
    out: list[Problem] = []
    for d, names in sorted(by_dir.items()):
        out += _deepspeed_latest(path, d, names, by_dir)
        if fnmatch.filter(names, MODEL_STATES) or any(ZERO.fullmatch(n) for n in names):
            out += _deepspeed_tag(path, d, names)
        out += _dcp(path, d, names)
        out += _trainer(path, d, names)
        out += _accelerate(d, names)
        if "adapter_config.json" in names and not names & set(PEFT_WEIGHTS):
            out.append(_problem(_join(d, "adapter_model.safetensors"), "missing",
                                f"{_join(d, 'adapter_config.json')} has no adapter weights beside it "
                                "(adapter_model.safetensors or .bin)"))
    return out


def _join(d: str, name: str) -> str:
    return posixpath.join(d, name) if d else name


def _deepspeed_latest(path: str, d: str, names: set[str], by_dir: dict[str, set[str]]) -> list[Problem]:
    if "latest" not in names:
        return []
    latest = _join(d, "latest")
    try:
        with open(os.path.join(path, latest), encoding="utf-8") as f:
            tag = f.read(256).strip()
    except (OSError, UnicodeDecodeError) as e:
        return [_problem(latest, "corrupt", f"cannot read DeepSpeed's latest: {e}")]
    if not TAG.fullmatch(tag) or tag in (".", ".."):
        return [_problem(latest, "corrupt", f"DeepSpeed's latest names no tag directory ({tag[:40]!r})")]
    tag_dir = _join(d, tag)
    if not by_dir.get(tag_dir):
        return [_problem(tag_dir + "/", "missing", f"{latest} names {tag}, which is not in the result")]
    if not fnmatch.filter(by_dir[tag_dir], MODEL_STATES):
        return [_problem(_join(tag_dir, "mp_rank_00_model_states.pt"), "missing",
                         f"{latest} names {tag}, which has no {MODEL_STATES}")]
    return []


def _deepspeed_tag(path: str, d: str, names: set[str]) -> list[Problem]:
    states = sorted(fnmatch.filter(names, MODEL_STATES))
    if not states:
        return [_problem(_join(d, "mp_rank_00_model_states.pt"), "missing",
                         f"DeepSpeed tag {d or '.'} has ZeRO optimizer states but no {MODEL_STATES}")]
    ranks: dict[str, set[int]] = defaultdict(set)  # mp rank -> the dp ranks present
    prefix = ""  # bf16_ and the like
    for n in names:
        m = ZERO.fullmatch(n)
        if m:
            ranks[m.group(2)].add(int(m.group(1)))
            prefix = n[:n.index("zero_pp_rank_")]
    world, zero = _model_states_info(os.path.join(path, _join(d, states[0])))
    if zero:  # every model-parallel rank has its optimizer shards
        for s in states:
            ranks.setdefault(s[len("mp_rank_"):-len("_model_states.pt")], set())
    out = []
    for mp, have in sorted(ranks.items()):
        for r in range(world if world else max(have, default=0) + 1):
            if r not in have:
                name = _join(d, f"{prefix}zero_pp_rank_{r}_mp_rank_{mp}_optim_states.pt")
                out.append(_problem(name, "missing", f"DeepSpeed ZeRO shard of rank {r} is not in the "
                                                     f"result (dp_world_size {world or '?'})"))
    return out


def _model_states_info(model_states: str) -> tuple[int | None, bool]:
    """(the `dp_world_size` DeepSpeed's model states record, whether its ds_config uses ZeRO), read by
    stubs; (None, False) when unreadable (the file's own check says why)."""
    try:
        with zipfile.ZipFile(model_states) as z:
            pkl = [n for n in z.namelist() if torchzip.is_pickle_record(n)]
            data = z.read(pkl[0]) if len(pkl) == 1 else b""
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None, False
    root = pickles.scan(data).root
    if not isinstance(root, dict):
        return None, False
    world = root.get("dp_world_size")
    config = root.get("ds_config")
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    stage = zero.get("stage") if isinstance(zero, dict) else None
    return (world if isinstance(world, int) and 0 < world < 1 << 20 else None,
            isinstance(stage, int) and stage > 0)


def _dcp(path: str, d: str, names: set[str]) -> list[Problem]:
    shards = sorted(n for n in names if n.endswith(".distcp"))
    if filecheck.DCP_METADATA not in names:
        return [_problem(_join(d, filecheck.DCP_METADATA), "missing",
                         f"{_join(d, shards[0])} has no {filecheck.DCP_METADATA} beside it in the result")
                ] if shards else []
    meta = _join(d, filecheck.DCP_METADATA)
    items = filecheck.read_dcp_metadata(os.path.join(path, meta))
    if isinstance(items, str):
        return []  # the file's own check reports it
    need: dict[str, int] = {}
    for rel, off, length, _ in items:
        need[rel] = max(need.get(rel, 0), off + length)
    out = []
    for rel, n in sorted(need.items()):
        file = _join(d, rel)
        if posixpath.basename(rel) != rel or rel not in names:
            out.append(_problem(file, "missing", f"{meta} names {rel}, which is not in the result"))
            continue
        try:
            size = os.path.getsize(os.path.join(path, file))
        except OSError:
            continue  # the file's own check reports it
        if size < n:
            out.append(_problem(file, "corrupt", f"{size} bytes, {meta} needs {n} (truncated)"))
    return out


def _trainer(path: str, d: str, names: set[str]) -> list[Problem]:
    if "trainer_state.json" not in names:
        return []
    state = _join(d, "trainer_state.json")
    if not names & set(HF_WEIGHTS):
        return [_problem(_join(d, "model.safetensors"), "missing",
                         f"{state} has no model weights beside it ({', '.join(HF_WEIGHTS[:3])}, ...)")]
    m = re.fullmatch(r"checkpoint-(\d+)", posixpath.basename(d))
    if not m:
        return []
    try:
        with open(os.path.join(path, state), encoding="utf-8") as f:
            step = json.load(f).get("global_step")
    except (OSError, ValueError, AttributeError):
        return []  # the file's own check reports it
    if isinstance(step, int) and step != int(m.group(1)):
        return [_problem(state, "corrupt", f"global_step {step} in {d}: another step's state")]
    return []


def _accelerate(d: str, names: set[str]) -> list[Problem]:
    series: dict[tuple[str, str], set[int]] = defaultdict(set)
    for n in names:
        m = NUMBERED.fullmatch(n)
        if m:
            series[(m.group(1), m.group(3))].add(int(m.group(2) or 0))
    out = []
    for (stem, ext), have in sorted(series.items()):
        if stem != "random_states" and 0 not in have:
            continue  # not accelerate's series (model_3.bin alone is a user's name)
        for i in range(max(have) + 1):
            if i not in have:
                name = f"{stem}_{i}.{ext}" if i or stem == "random_states" else f"{stem}.{ext}"
                out.append(_problem(_join(d, name), "missing",
                                    f"{name} is not in the result, but {stem} files after it are"))
    return out
