#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then lint, type-check and test.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
# openssh-server, iproute2 and rsync run the multi-host SSH test bed (tests/testbed.py), sshfs its
# network-FS mode (tests/testbed_storage.py); slurmd, slurmctld, slurm-client and munge the Slurm
# cluster bed (tests/slurmbed.py: its own munged and key, the system's are left alone), slurmdbd and
# mariadb-server its accounting (`sacct`: its own MariaDB datadir, no system service is used);
# chromium opens `ablate report`'s page headless (tests/test_report.py); parallel (GNU) is what
# scripts/bench_fanout.py compares the fan-out against (tests/test_bench_fanout.py); shellcheck
# lints the wrappers.
if ! { command -v tmux && [ -x /usr/sbin/sshd ] && command -v ip && command -v rsync && command -v ps \
       && [ -x /usr/bin/chromium ] && command -v parallel && command -v sshfs \
       && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/slurmctld ] && command -v sbatch \
       && [ -x /usr/sbin/munged ] && [ -x /usr/sbin/slurmdbd ] && [ -x /usr/sbin/mariadbd ] \
       && command -v shellcheck; } >/dev/null; then
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux openssh-server iproute2 rsync procps \
    chromium parallel sshfs slurmd slurmctld slurm-client munge slurmdbd mariadb-server shellcheck >/dev/null
fi
# torch is pinned: 2.13.0 is the CPU build; an unpinned torch would pull gigabytes of CUDA.
python3 -m pip install -q torch==2.13.0 -e '.[test]'
python3 -m ruff check ablate tests scripts
python3 -m mypy ablate
shellcheck -x -S warning wrappers/*.sh
# Without arguments: the suite in two pytest-xdist workers, each session test bed (the SSH
# instances, the slow network FS, the Slurm cluster: tests/conftest.py) one group built once in one
# worker, so the beds' waits overlap; then the host agent's timing tests (tests/test_ssh_agent.py)
# alone: they time a silent agent's seconds-long window, which the other worker's load stretches.
# With arguments: pytest with them, one test at a time (`bash scripts/test.sh tests/test_walk.py`).
if [ $# -eq 0 ]; then
  python3 -m pytest -q -n 2 --dist loadgroup --ignore=tests/test_ssh_agent.py
  python3 -m pytest -q tests/test_ssh_agent.py
else
  python3 -m pytest -q "$@"
fi
