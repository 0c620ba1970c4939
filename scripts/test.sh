#!/usr/bin/env bash
# Install what the tests need on a fresh machine, then lint, type-check and test.
#
#   bash scripts/test.sh              everything, as CI runs it (apt-get, then the three tiers at once)
#   bash scripts/test.sh unit         the tests that need neither root, tmux nor a test bed: Python
#                                     packages only, no apt-get; ruff, not mypy (see below)
#   bash scripts/test.sh tmux         the tests that run real tmux (and the other apt-installed tools)
#   bash scripts/test.sh bed          the tests on the namespace test beds (root: sshd instances,
#                                     sshfs, a Slurm cluster)
#   bash scripts/test.sh PYTEST_ARGS  pytest with them, after the full install (`tests/test_queue_walk.py`)
#
# The tiers are marks (tests/helpers/tiers.py); a unit-tier test finds the apt-installed tools
# stubbed out on its PATH in every run, so one that needs them fails until it is marked.
#
# The unit tier is CPU-bound on a 2-core machine (~90-100 s of CPU in 52-61 s, most of it in the real
# trainers, wrappers, runner processes and moto's S3 server the tests start; every xdist worker
# collects every test module, so no module imports torch, transformers or lightning at collection:
# that alone was 7 s of CPU per worker). It runs ruff (half a
# second) but leaves mypy to the full run: `mypy ablate` costs ~16 s of CPU with a cold cache (a fresh
# clone), ~8 s of the tier's wall time; run `python3 -m mypy ablate` by hand when typing matters. Its
# tests run in WORKERS (default 4) xdist workers, two per core: the extra ones fill the seconds the
# others spend waiting on their subprocesses and timers. `--dist loadgroup` keeps the tests that
# import torch in one worker (they also share the checkpoints the frameworks wrote: once per
# installation of them, kept in the user's cache dir); the longest tests go first (by their seconds in the
# last runs: tests/helpers/schedule.py), so the end of the run is not one long test alone.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
tier=${1-all}

apt_tools() {
  # openssh-server, iproute2 and rsync run the multi-host SSH test bed (tests/testbed.py), sshfs its
  # network-FS mode (tests/testbed_storage.py); slurmd, slurmctld, slurm-client and munge the Slurm
  # cluster bed (tests/slurmbed.py: its own munged and key, the system's are left alone), slurmdbd
  # and mariadb-server its accounting (`sacct`: its own MariaDB datadir, no system service is used);
  # chromium opens `ablate report`'s page headless (tests/test_report_*.py); parallel (GNU) is what
  # scripts/bench_fanout.py compares the fan-out against (tests/test_bench_fanout.py); shellcheck
  # lints the wrappers.
  if ! { command -v tmux && [ -x /usr/sbin/sshd ] && command -v ip && command -v rsync && command -v ps \
         && [ -x /usr/bin/chromium ] && command -v parallel && command -v sshfs \
         && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/slurmctld ] && command -v sbatch \
         && [ -x /usr/sbin/munged ] && [ -x /usr/sbin/slurmdbd ] && [ -x /usr/sbin/mariadbd ] \
         && command -v shellcheck; } >/dev/null; then
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux openssh-server iproute2 rsync \
      procps chromium parallel sshfs slurmd slurmctld slurm-client munge slurmdbd mariadb-server \
      shellcheck >/dev/null
  fi
}

# torch is pinned: 2.13.0 is the CPU build; an unpinned torch would pull gigabytes of CUDA. Skipped
# when this checkout is already installed with everything the tests import (found, not imported:
# importing torch, transformers, lightning and peft would cost this check ten seconds).
python_packages() {
  # -I: the installed packages only (not this directory, which holds an `ablate` of its own). Exit 1:
  # a package is missing (or torch is not 2.13.0, or a pin of setup.cfg's differs): everything is
  # installed. Exit 3: only `ablate` is another clone's (a fresh clone on a machine that has the
  # rest): this one is installed alone, ~1.6 s against ~8 s for pip's resolution of all of them.
  local rc=0
  python3 -I - 2>/dev/null <<'PY' || rc=$?
import configparser, importlib.metadata as md, importlib.util as u, pathlib, re, sys
need = ("ablate", "torch", "pytest", "xdist", "ruff", "mypy", "moto", "transformers", "lightning", "accelerate",
        "peft")
if any(u.find_spec(m) is None for m in need) or md.version("torch").split("+")[0] != "2.13.0":
    sys.exit(1)
cfg = configparser.ConfigParser()
cfg.read("setup.cfg")
for req in (cfg["options"]["install_requires"] + "\n" + cfg["options.extras_require"]["test"]).split("\n"):
    m = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*(?:==\s*([^\s;,]+))?", req.strip())
    if m is None:
        continue
    have = md.version(m.group(1))  # a missing one raises: exit 1
    if m.group(2) and have != m.group(2):
        sys.exit(1)  # a pin of setup.cfg's that differs
here = pathlib.Path.cwd().resolve()
ablate = pathlib.Path(u.find_spec("ablate").origin).resolve()
if ablate.parents[1] != here:
    sys.exit(3 if u.find_spec("setuptools") is not None else 1)
PY
  case $rc in
    0) ;;
    3) python3 -m pip install -q --no-deps --no-build-isolation -e . ;;
    *) python3 -m pip install -q torch==2.13.0 -e '.[test]' ;;
  esac
}

lint() {
  python3 -m ruff check ablate tests scripts
  python3 -m mypy ablate
}

# pytest plugins installed beside the test tools that no test uses: each costs every pytest process
# (each xdist worker too) a second or more at start-up.
NO_PLUGINS=(-p no:libtmux -p no:hypothesispytest -p no:benchmark -p no:anyio)

# Byte code is written even where PYTHONDONTWRITEBYTECODE is set (into git-ignored __pycache__/):
# pytest keeps its assertion-rewritten test modules there, without which every pytest process (each
# xdist worker) rewrites all of them again (~8 s of CPU), and every Python process the tests start
# compiles the ablate modules it imports again.
unset PYTHONDONTWRITEBYTECODE

# `pytest -m "MARKS and not alone"` in WORKERS xdist workers, then `-m "MARKS and alone"` in one
# process, collecting only the files that hold TIER's tests marked `alone` (the first run lists
# them: tests/helpers/tiers.py), and not at all when it has none.
two_passes() {
  local tier=$1 marks=$2 workers=$3 list files
  list=$(mktemp -d)/alone
  ABLATE_TEST_ALONE_FILES=$list ABLATE_TEST_ALONE_TIER=$tier python3 -m pytest -q "${NO_PLUGINS[@]}" \
    -n "$workers" --dist loadgroup --no-loadscope-reorder -m "$marks and not alone"
  files=()
  [ -e "$list" ] && mapfile -t files <"$list"
  if [ ! -e "$list" ] || [ "${#files[@]}" -gt 0 ]; then
    python3 -m pytest -q "${NO_PLUGINS[@]}" -m "$marks and alone" "${files[@]}" || [ $? = 5 ]
  fi
  rm -rf "$(dirname "$list")"
}

case $tier in
  unit)
    python_packages
    python3 -m ruff check ablate tests scripts
    # No byte code yet (a fresh clone): two processes write it, half the test modules each (pytest's
    # rewritten asserts are most of it), rather than every worker all of it for itself.
    if ! compgen -G "tests/__pycache__/conftest.*pytest*.pyc" >/dev/null; then
      mapfile -t modules < <(compgen -G "tests/test_*.py" | sort)
      half=$(( ${#modules[@]} / 2 ))
      python3 -m pytest -q --co "${NO_PLUGINS[@]}" "${modules[@]:0:half}" >/dev/null &
      python3 -m pytest -q --co "${NO_PLUGINS[@]}" "${modules[@]:half}" >/dev/null || true
      wait $! || true
    fi
    # Longest first (tests/helpers/schedule.py): by each test's seconds in the last runs, kept in
    # pytest's cache; a fresh clone has none and runs them in collection order.
    ABLATE_TEST_LONGEST_FIRST=1 two_passes unit unit "${WORKERS:-4}"
    ;;
  tmux)
    apt_tools
    python_packages
    two_passes tmux "tmux and not bed" 2
    ;;
  bed)
    apt_tools
    python_packages
    two_passes bed bed 2
    ;;
  all)
    apt_tools
    python_packages
    lint
    shellcheck -x -S warning wrappers/*.sh
    # The suite in three pytest-xdist workers, each session test bed (the SSH instances, the slow
    # network FS, the Slurm cluster: tests/helpers/tiers.py) one group built once in one worker, so
    # the beds' waits overlap; then the tests marked `alone` (the host agent's timing tests) in one
    # process: they time a silent agent's seconds-long window, which the other worker's load stretches.
    python3 -m pytest -q "${NO_PLUGINS[@]}" -n 3 --dist loadgroup --no-loadscope-reorder -m "not alone"
    python3 -m pytest -q "${NO_PLUGINS[@]}" -m alone
    ;;
  *)
    apt_tools
    python_packages
    python3 -m pytest -q "${NO_PLUGINS[@]}" "$@"
    ;;
esac
