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
# One test at a time. `-n 2 --dist loadgroup` runs the test beds (each a group, tests/conftest.py)
# side by side in about half the time, but test_ssh_agent.py's timing tests are not reliable yet
# under that load (README, Development).
python3 -m pytest -q "$@"
