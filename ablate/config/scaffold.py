"""`ablate init`: scaffold a commented `ablate.yaml` and `queues/` in a repo.

Profile `local` gets a working example (the packaged demo trainer and three example configs), so
`ablate init && ablate plan && ablate launch --all` runs as is. An ssh profile gets a template
whose hosts and workdir are placeholders to fill in; a Slurm profile (`transport: slurm`) the same
template with one host of N queues (N batch jobs) instead of machines. Nothing is overwritten: if
any file to be created exists, nothing is written.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from ablate.config.project import CONFIG_NAME, load_profile, shipped_profiles
from ablate.errors import AblateError, ConfigError
from ablate.util.fs import atomic_write

EXAMPLE_CONFIGS = {
    "baseline": "lr: 0.1\nhidden: 8\nseed: 1\n",
    "lr_low": "lr: 0.01\nhidden: 8\nseed: 1\n",
    "small": "lr: 0.1\nhidden: 4\nseed: 1\n",
    "wide": "lr: 0.1\nhidden: 16\nseed: 1\n",
}

_COMMON_TAIL = """\
# Per-host disk budget (checked before launch): ckpt_size x cells in the queue + scratch.
budget: {{ckpt_size: {ckpt_size}, scratch: {scratch}}}
"""

_LOCAL = """\
# ablate.yaml: the sweep. Its keys are described in ablate's docs/configuration.md; `ablate plan` splits the
# cells into queues/, `ablate launch --all` starts them, `ablate status` shows them.
profile: local                  # profiles/local.yaml: this machine; the "shared FS" is .ablate/shared
sweep: example                  # names this sweep's directory on the shared FS
# The train command, run once per cell in the repo root. Fields: {{cfg}} {{task}} {{epochs}} {{name}}
# (cfg basename) {{ckpt_dir}} (where the checkpoint must be written) {{cat}} (cfg's directory
# name) {{resume}} (1 when {{ckpt_dir}} holds a checkpoint to resume from) {{gpu}} {{run_id}} {{attempt}}.
# This one is ablate's tiny demo trainer; replace it with yours.
train: {train}
artifacts:                      # what each cell must leave in {{ckpt_dir}}; checked by loading it
  checkpoint: model.safetensors
  metrics: metrics.json
  metrics_keys: [val_loss]
tasks:                          # default epochs and relative cost per epoch (for balancing)
  demo: {{epochs: 5, cost_per_epoch: 1.0}}
cells:                          # what `ablate plan` splits; `**` matches across directories
  - {{glob: "configs/ablate-example/*.yaml", task: demo}}
hosts:                          # on profile local, host names are just labels
  local-1: {{speed: 1.0}}
  local-2: {{speed: 1.0}}
"""

_REMOTE = """\
# ablate.yaml: the sweep. Fill in the CHANGE-ME values, then run `ablate doctor`.
# {profile_note}
profile: {profile}
sweep: ablation-v1              # names this sweep's directory on the shared FS
workdir: {workdir}   # CHANGE-ME: the repo on the {where}; cwd of the train command
# The train command, run once per cell. Fields: {{cfg}} {{task}} {{epochs}} {{name}} (cfg basename)
# {{ckpt_dir}} (write the checkpoint there) {{cat}} (cfg's directory name) {{resume}} (1 when
# {{ckpt_dir}} holds a checkpoint to resume from: load it) {{gpu}} {{run_id}} (the same on every
# run of the cell: a wandb run id) {{attempt}}.
train: >-
  python train.py --config {{cfg}} training.epochs={{epochs}}
  training.checkpoint_dir={{ckpt_dir}} wandb.group={{task}}_{{cat}} wandb.name={{name}}
artifacts:                      # must exist in {{ckpt_dir}} after training, and verify
  checkpoint: best.pth          # or a directory, a glob, or a list: docs/configuration.md#checkpoints
  # pick: newest                # a glob's newest match only (Lightning's "epoch=*.ckpt")
  metrics: metrics.json         # optional: must parse as JSON
  metrics_keys: [val_loss]      # and hold these keys
  # verify: hash                # checked without loading: a format ablate cannot read (docs/configuration.md)
tasks:                          # default epochs and relative cost per epoch (for balancing)
  reconstruction: {{epochs: 20, cost_per_epoch: 1.0}}
  detection: {{epochs: 50, cost_per_epoch: 2.5}}
cells:                          # what `ablate plan` splits; or delete this and write queues/ by hand
  - {{glob: "configs/ablation/recon/*.yaml", task: reconstruction}}
  - {{glob: "configs/ablation/det/*.yaml", task: detection}}
# ssh_config: ~/.ssh/config     # HostName, Port, User, IdentityFile, ProxyJump are honoured
# calibrate: python train.py --benchmark --gpu {{gpu}}   # a few seconds of your steps, timed once per
#                               # host and GPU: the longest cells go to the GPUs measured fastest
"""

_SSH_HOSTS = """\
hosts:                          # CHANGE-ME: key = ssh alias (from ~/.ssh/config) unless `ssh:` says otherwise
  {host}-1: {{speed: 1.0{iid}}}
  {host}-2: {{speed: 1.3, gpus: [0, 1]{iid}}}   # a faster box; one queue per GPU slot
"""

# A Slurm host is not a machine: `queues: N` is N batch jobs, each running one queue.
_SLURM_HOSTS = """\
hosts:                          # a Slurm host is N queues = N batch jobs, not a machine
  cluster: {queues: 4}          # plan balances the cells over its 4 queues; Slurm picks each job's
                                # node and GPUs (slurm.gpus per job in the profile), not ablate
"""

_NOTES = {
    "autodl": "AutoDL file storage (/root/autodl-fs) is shared per REGION only: keep all hosts in one "
              "region.",
    "runpod": "RunPod: attach one network volume (/workspace) to every pod; install tmux on each pod.",
    "vast": "Vast.ai has no shared FS: the sweep lives in an S3-compatible bucket; copy profiles/vast.yaml "
            "into your repo and set storage: (and storage_endpoint: for R2, B2, MinIO).",
    "bare": "Bare servers: copy profiles/bare.yaml into your repo and set shared_fs to your NFS mount.",
}
_SLURM_NOTE = ("Slurm: copy profiles/slurm.yaml into your repo and set shared_fs, ckpt_root and its "
               "slurm: keys\n# (login, partition, account, time) for your cluster; each queue runs as one "
               "batch job.")


def render(profile: str, transport: str = "ssh") -> str:
    """The ablate.yaml text for `profile` whose transport is `transport`."""
    if transport == "local":
        train = (f"{shlex.quote(sys.executable)} -m ablate.demo.train --config {{cfg}} "
                 "--epochs {epochs} --out {ckpt_dir} --resume {resume}")
        text = _LOCAL.format(train=json.dumps(train)).replace("profile: local ", f"profile: {profile} ", 1)
        return text + _COMMON_TAIL.format(ckpt_size="1MB", scratch="10MB")
    workdir = {"autodl": "/root/autodl-fs/code/CHANGE-ME", "runpod": "/workspace/code/CHANGE-ME"}.get(
        profile, "/root/code/CHANGE-ME")
    iid = ", instance_id: CHANGE-ME" if profile in ("runpod", "vast") else ""
    note = _NOTES.get(profile, f"Profile {profile}: check its shared_fs and ckpt_root.")
    where = "instances"
    if transport == "slurm":  # the repo as the compute nodes see it (a directory they all mount)
        workdir, where = "/home/CHANGE-ME/code/project", "compute nodes"
        note = _SLURM_NOTE if profile == "slurm" else \
            f"Profile {profile} (Slurm): check its shared_fs, ckpt_root and slurm: keys."
    text = _REMOTE.format(profile=profile, profile_note=note, workdir=workdir, where=where)
    text += _SLURM_HOSTS if transport == "slurm" else _SSH_HOSTS.format(host=profile, iid=iid)
    return text + _COMMON_TAIL.format(ckpt_size="2GB", scratch="20GB")


def init(directory: Path, profile: str = "local") -> list[Path]:
    """Create ablate.yaml and queues/ (and, for a local profile, example configs). Returns the
    paths created. Refuses (exit 2, nothing written) when ablate.yaml or any of them exists."""
    directory = Path(directory)
    config = directory / CONFIG_NAME
    if config.exists():
        raise AblateError(f"{config} already exists; ablate init never overwrites it "
                          "(edit it, or run init in another directory)")
    shipped = shipped_profiles()
    if profile not in shipped and not (directory / "profiles" / f"{profile}.yaml").is_file():
        raise ConfigError(f"unknown profile {profile!r}; shipped: {', '.join(sorted(shipped))} "
                          f"(or add profiles/{profile}.yaml to the repo first)")
    resolved = load_profile(profile, directory.resolve(), "--profile")  # a bad repo profile: refused now
    files: dict[Path, str] = {config: render(profile, resolved.transport)}
    if resolved.transport == "local":
        for name, body in EXAMPLE_CONFIGS.items():
            files[directory / "configs" / "ablate-example" / f"{name}.yaml"] = body
    if not (directory / "queues").is_dir():
        files[directory / "queues" / ".gitkeep"] = ""
    clash = [p for p in files if p.exists() or p.is_symlink()]
    if clash:
        raise AblateError(f"{clash[0]} already exists; ablate init writes nothing over existing files "
                          "(move it away, or run init in another directory)")
    for path, body in files.items():
        atomic_write(path, body.encode())
    return list(files)
