#!/usr/bin/env bash
# ablate run_queue: run the cells of one queue file in order, one at a time, on this host; when the
# queue drains, steal not-yet-started cells from the queue expected to finish last.
#
#   bash run_queue.<sha12>.sh SPEC QUEUE START_INDEX [SLOT]
#
# Formats of everything written here (claims, events, heartbeat, tails) and read here (stop files)
# are in docs/ARCHITECTURE.md. This bash is the queue's life: signals, claims, events, the
# heartbeat, services, outage waits, running a cell. Which line it takes next (the queue-line
# grammar, the head deal, the steal, re-entries, deferred lines) is the walk of its runner process,
# the stdlib-only ablate/remote/queue/serve.py run as this shell's co-process for the queue's life: each
# step a short script of what to do, done here in order; no decision costs a Python start. Values
# from the spec and the walk are safe by construction ([A-Za-z0-9._/+@,=-], checked again here),
# so they go into JSON and commands without escaping.
# Slurm's USR2 (`--signal=B:USR2@grace`) may come the moment the job starts: slurmctld checks time
# limits every 30 s and signals a job whose time left is within grace + 30 s, so a job whose time is
# under grace + 30 s gets it at once. Until this shell can act on it (it knows its attempt: below,
# before `calibrate`) it is noted, not fatal (bash's default for USR2 ends the job unrequeued).
trap 'EARLY_USR2=1' USR2
# One compound command, parsed whole before any of it runs: bash reads a script as it goes, and
# this file is on the shared FS, which can go away mid-run (an outage of a network FS).
{
set -u
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2: `&` in a ${x//p/r} replacement is literal

if (( $# < 3 || $# > 4 )); then
  echo "usage: run_queue.sh SPEC QUEUE START_INDEX [SLOT]" >&2
  exit 2
fi
SPEC=$1 QUEUE=$2 START=$3 SLOT=${4-}
NAME_RE='^[A-Za-z0-9][A-Za-z0-9._+-]*$'  # host, queue and cell names: plain path components
if [[ ! $START =~ ^[0-9]+$ || ( -n $SLOT && ! $SLOT =~ ^[0-9]+$ ) || ! $QUEUE =~ $NAME_RE ]]; then
  echo "run_queue: QUEUE must be a plain name, START_INDEX and SLOT whole numbers, got '$QUEUE' '$START' '$SLOT'" >&2
  exit 2
fi
CLAIM_WAIT_ENV=${ABLATE_CLAIM_WAIT-}  # the queue's environment may shorten the spec's (tests do)
# shellcheck source=/dev/null
source "$SPEC" || { echo "run_queue: cannot read the run spec $SPEC" >&2; exit 2; }
ABLATE_CLAIM_WAIT=${CLAIM_WAIT_ENV:-${ABLATE_CLAIM_WAIT-}}
# The spec's numbers, each written by `ablate deploy` from its one definition in Python (docs/
# ARCHITECTURE.md, "Run spec"): this shell keeps no copy of them, and runs nothing without them.
for v in ABLATE_HEARTBEAT_SECS ABLATE_STEAL ABLATE_PIN_GPU ABLATE_STOP_GRACE ABLATE_CLAIM_WAIT ABLATE_FS_WAIT \
    ABLATE_CALIBRATE_TIMEOUT ABLATE_SLURM_GRACE ABLATE_SLURM_MAX_RESTARTS ABLATE_SLURM_RESUBMIT \
    ABLATE_SLURM_FALLBACK_WAIT ${ABLATE_SERVICES:+ABLATE_SVC_GRACE}; do
  [[ ${!v-} =~ ^[0-9]{1,7}$ ]] || { echo "run_queue: the run spec $SPEC has no $v (got '${!v-}'): deploy again" >&2; exit 2; }
done

SAFE='^[A-Za-z0-9._/+@,=-]+$'
ROOT=$ABLATE_ROOT
# A sweep kept in an object store (ABLATE_STORE, docs/ARCHITECTURE.md "The object store"): ROOT is
# this instance's own copy of it, kept in step with the store by the runner's process (pull before each
# step, what this queue writes sent as it is written; claims and results go to the store itself).
# Credentials given at launch arrive through a FIFO, `NAME=VALUE` lines (AWS_* only) then EOF: held in
# this shell unexported and handed to the runner's process alone (never the trainer's environment,
# never a file).
export ABLATE_STORE=${ABLATE_STORE-} ABLATE_STORE_ENDPOINT=${ABLATE_STORE_ENDPOINT-}
STORE_CREDS=()
if [[ -n ${ABLATE_CREDS_FIFO-} && -p $ABLATE_CREDS_FIFO ]]; then
  while IFS= read -r cred; do
    # AWS_NAME=VALUE, the value at most 4096 characters, none a control character. (Not as one
    # regex: a bounded repetition `[^[:cntrl:]]{0,4096}` costs glibc's matcher ~0.1 s of CPU a line.)
    [[ $cred =~ ^AWS_[A-Z_]{1,40}= && $cred != *[[:cntrl:]]* ]] && (( ${#cred} - ${#BASH_REMATCH} <= 4096 )) \
      && STORE_CREDS+=("$cred")
  done <"$ABLATE_CREDS_FIFO"
  rm -f -- "$ABLATE_CREDS_FIFO"
fi
unset ABLATE_CREDS_FIFO cred
EVENTS=$ROOT/events/$ABLATE_HOST.$QUEUE.jsonl
HB=$ROOT/heartbeats/$ABLATE_HOST.$QUEUE
HB_TMP_PREFIX=$ROOT/heartbeats/.$ABLATE_HOST.$QUEUE
CLAIMS=$ROOT/claims
FINAL=$ROOT/final_ckpts
TAILS=$ROOT/tails
STOP_FILE=$ROOT/control/$ABLATE_HOST.$QUEUE.stop
RQ_FILE=${BASH_SOURCE[0]##*/}
SPEC_FILE=${SPEC##*/}
mkdir -p "$ROOT/events" "$ROOT/heartbeats" "$CLAIMS" "$FINAL" "$TAILS" || {
  echo "run_queue: cannot create directories under $ROOT" >&2
  exit 2
}
export ABLATE_TASK_EPOCHS=${ABLATE_TASK_EPOCHS-} ABLATE_HEARTBEAT_SECS ABLATE_FS_WAIT ABLATE_CLAIM_WAIT  # for the decisions

# The process group is what `ablate stop` kills: fields after "(comm)" in /proc/PID/stat are
# state, ppid, pgrp.
PGID=
if read -r stat 2>/dev/null </proc/$$/stat; then
  read -r _ _ PGID _ <<<"${stat##*) }"
fi
[[ $PGID =~ ^[0-9]+$ ]] || PGID=$(ps -o pgid= -p $$ 2>/dev/null | tr -d ' ')
[[ $PGID =~ ^[0-9]+$ ]] || PGID=null

# mtimes with sub-second precision where stat has it (coreutils >= 8.?: %.6Y), else whole seconds.
MT_FMT=%Y
if mt=$(stat -c %.6Y -- "$SPEC" 2>/dev/null) && [[ $mt =~ ^[0-9]+\.[0-9]+$ ]]; then
  MT_FMT=%.6Y
fi

# shellcheck source=wrappers/common.sh
source "${BASH_SOURCE[0]%/*}/common.sh"  # ablate: inline (deploy puts wrappers/common.sh here)

# idx, cell and from_queue always describe the same (current or last) cell: idx is a line of
# from_queue's file when the cell was stolen, else of ours. CUR_STARTED is empty between cells.
STATE=running CUR_IDX=$START CUR_CELL='' CUR_STARTED='' FROM_Q='' CUR_LOG='' NEXT=$START  # NEXT: our own next line
hb_write() {  # the heartbeat file, tmp + mv: readers never see half of it; its mtime is the beat
  local cell=null started=null slot=null from=null lmt=null lsz=null st tmp=$HB_TMP_PREFIX.$BASHPID.tmp
  [[ -n $CUR_CELL ]] && cell="\"$CUR_CELL\""
  [[ -n $FROM_Q ]] && from="\"$FROM_Q\""
  [[ -n $SLOT ]] && slot=$SLOT
  if [[ -n $CUR_STARTED ]]; then
    started=$CUR_STARTED
    # The log's mtime and size tell a hung trainer from a live one: this beat goes on regardless.
    if [[ -e $CUR_LOG ]] && st=$(stat -c "$MT_FMT %s" -- "$CUR_LOG" 2>/dev/null) \
        && [[ $st =~ ^([0-9]+(\.[0-9]+)?)\ ([0-9]+)$ ]]; then
      lmt=${BASH_REMATCH[1]} lsz=${BASH_REMATCH[3]}
    fi
  fi
  # next: our own next line, NEXT (idx is another queue's line while on a cell taken from it; and
  # not the loop's $idx, which run_cell shadows with its cell's line); deferred: own lines before it
  # left to the head deal
  local deferred=${DEFERRED[*]-}
  svc_json
  now
  printf '{"t": %s, "host": "%s", "queue": "%s", "slot": %s, "pid": %s, "pgid": %s, "state": "%s", "idx": %s, "cell": %s, "cell_started": %s, "from_queue": %s, "log_mtime": %s, "log_size": %s, "run_queue": "%s", "spec": "%s", "next": %s, "deferred": [%s], "services": %s}\n' \
    "$T" "$ABLATE_HOST" "$QUEUE" "$slot" "$$" "$PGID" "$STATE" "$CUR_IDX" "$cell" "$started" \
    "$from" "$lmt" "$lsz" "$RQ_FILE" "$SPEC_FILE" "$NEXT" "${deferred// /, }" "$REPLY" >"$tmp" \
    && mv -f "$tmp" "$HB"
}

# Why the running cell is being stopped, for the trainer to read on its TERM (docs/troubleshooting.md,
# "Stopping a cell gives it time to save"): one JSON line {"reason", "t", "kill_after"} written
# before the TERM whenever this queue or `ablate stop` sends it; removed before each cell starts.
export ABLATE_STOP_FILE=$ABLATE_CKPT_ROOT/.ablate-stop/$ABLATE_HOST.$QUEUE
pid_alive() {  # pid_alive PID: still running (not exited, not a zombie waiting for us)
  local st
  [[ -n $1 ]] && { read -r st </proc/$1/stat; } 2>/dev/null || return 1
  st=${st##*) }
  [[ ${st:0:1} != Z ]]
}

# shellcheck source=wrappers/services.sh
source "${BASH_SOURCE[0]%/*}/services.sh"  # ablate: inline (deploy puts wrappers/services.sh here)

# A background ticker rewrites the heartbeat every ABLATE_HEARTBEAT_SECS. It is restarted at each
# transition, so it always holds the current state and the heartbeat has one writer at a time.
TICKER=
ticker_start() {
  (
    sp=
    trap '[[ -n $sp ]] && kill "$sp" 2>/dev/null; exit 0' TERM
    while :; do
      sleep "$ABLATE_HEARTBEAT_SECS" &
      sp=$!
      wait "$sp"
      hb_write
    done
  ) &
  TICKER=$!
}
ticker_stop() {  # ticker_stop [signalled]: after a signal to our group its end is polled, not
  # waited for: bash 5.2 can lose the end of a child that signal ended, and `wait PID` then blocks
  # for as long as another child (the runner's process, a service) lives
  local n=0
  if [[ -n $TICKER ]]; then
    kill "$TICKER" 2>/dev/null
    if [[ -n ${1-} ]]; then
      while pid_alive "$TICKER" && (( n++ < 500 )); do sleep 0.01; done
    else
      wait "$TICKER" 2>/dev/null
    fi
    rm -f "$HB_TMP_PREFIX.$TICKER.tmp"
    TICKER=
  fi
}
transition() { ticker_stop; hb_write; ticker_start; }
halt() {  # halt [signalled]: the queue stops: its ticker and services, then the heartbeat `stopped`
  ticker_stop "${1-}"
  svc_stop_all
  STATE=stopped CUR_STARTED=
  hb_write
}

CHILD=
cut_cell() {  # the running cell as a JSON value (null between cells), for a stop's event
  if [[ -n $CUR_STARTED && -n $CUR_CELL ]]; then printf '"%s"' "$CUR_CELL"; else printf null; fi
}
child_gone() {  # child_gone SECONDS: wait up to SECONDS for the running cell (run_one) to end
  local n=0
  while pid_alive "$CHILD" && (( n++ < $1 * 5 )); do sleep 0.2; done
}
# What Slurm's signal makes of the queue is the runner's `stop-plan` (ablate/remote/slurm/stop_plan.py):
# WHY (the queue_stop's reason: time_limit, preempted, slurm_signal), REQUEUE (ask Slurm for the
# job again), WAIT (seconds the cut cell has to save: Slurm's time left or window, less a margin
# for this shell's own ending), CUT (record the cut: no_progress?), CAPPED (max_restarts refused the
# requeue). A runner that cannot answer: the spec's fallback wait, nothing requeued.
WHY='' REQUEUE=0 WAIT=0 CUT=0 CAPPED=0
PLAN='^why=(time_limit|preempted|slurm_signal) requeue=([01]) wait=([0-9]{1,7}) cut=([01]) capped=([01])'
stop_plan() {  # stop_plan usr2|term
  local running=0
  [[ $(cut_cell) != null ]] && running=1
  if decide stop-plan --signal "$1" --grace "$ABLATE_SLURM_GRACE" --max-restarts "$ABLATE_SLURM_MAX_RESTARTS" \
      --resubmit "$ABLATE_SLURM_RESUBMIT" --running "$running" && [[ $DECISION =~ $PLAN ]]; then
    WHY=${BASH_REMATCH[1]} REQUEUE=${BASH_REMATCH[2]} WAIT=${BASH_REMATCH[3]} CUT=${BASH_REMATCH[4]} CAPPED=${BASH_REMATCH[5]}
    return 0
  fi
  WHY=time_limit REQUEUE=0 WAIT=$ABLATE_SLURM_FALLBACK_WAIT CUT=0 CAPPED=0
  [[ $1 == term ]] && WHY=slurm_signal
  say "the runner's process did not answer: the cell has ${WAIT}s, and the job is not requeued"
}
on_signal() {  # `ablate stop` (TERM to the group), tmux kill-session (HUP), Ctrl-C, Slurm's TERM
  trap '' HUP INT TERM
  ALONE=1
  if [[ -n $ATTEMPT && -n $CHILD ]]; then
    # Slurm's TERM (scancel, a preemption without a user signal) reached every process of the job;
    # the job ends when this shell does, so it waits for the cell through the site's window
    # (GraceTime + KillWait), then kills what is left. The cut cell keeps its claim.
    stop_plan term
    ev queue_stop ", \"idx\": ${CUR_IDX:-null}, \"cell\": $(cut_cell), \"reason\": \"$WHY\", \"kill_after\": $WAIT"
    kill_cell "$WHY" "$WAIT" signalled
    halt signalled
    exit "$1"
  fi
  # The running cell stops with the queue. Under tmux this shell leads its own process group;
  # started any other way, only our own child is signalled, never a group we do not own.
  if [[ $PGID == "$$" ]]; then
    kill -TERM -- "-$PGID" 2>/dev/null
  elif [[ -n $CHILD ]]; then
    kill -TERM "$CHILD" 2>/dev/null
  fi
  # It saves while this shell lives: the pane's end would HUP it (tmux). `ablate stop` said why in
  # ABLATE_STOP_FILE and KILLs the group after stop_grace; this shell waits no longer either.
  [[ -n $CHILD ]] && child_gone "$ABLATE_STOP_GRACE"
  halt signalled
  exit "$1"
}
elapsed() {  # elapsed T0: REPLY = the seconds since T0 (a `now` T), to the microsecond
  local us
  now
  us=$(( ${T/./} - ${1/./} ))
  printf -v REPLY '%d.%06d' $((us / 1000000)) $((us % 1000000))
}
no_progress() {  # the cut cell's record (runner `cut`): when its checkpoint is what it was at its
  # last time-limit cut, by an earlier attempt, it has not moved in a whole job: its `end` says so
  # (no_progress, exit 124) and no attempt re-enters it; `ablate remediate` says what to do
  decide cut --cell "$CUR_CELL" --attempt "$ATTEMPT" --ckpt-dir "$ABLATE_CKPT_ROOT/$CUR_CELL" \
    --checkpoint "${ABLATE_CHECKPOINT-}" && [[ $DECISION =~ ^stuck\ ([0-9_]+\.[0-9]+)\ ([0-9a-z]+) ]] || return 1
  local earlier=${BASH_REMATCH[1]} fp=${BASH_REMATCH[2]}
  write_tail "$CUR_CELL"
  elapsed "$CUR_STARTED"
  ev end ", \"idx\": $CUR_IDX, \"cell\": \"$CUR_CELL\", \"rc\": 124, \"dur\": $REPLY, \"reason\": \"no_progress\", \"since\": \"$earlier\", \"checkpoint\": \"$fp\"${FROM_Q:+, \"from_queue\": \"$FROM_Q\"}"
  say "$CUR_CELL: its checkpoint is as the time limit of attempt $earlier left it: it needs more than time - grace, or its trainer does not resume; stopped, for \`ablate remediate\`"
}
on_time_limit() {  # Slurm's --signal=B:USR2@grace: the time limit is near, or the job is preempted
  trap '' USR2 HUP INT TERM
  ALONE=1
  local cell how=resumable
  cell=$(cut_cell)
  # A preemption (the site's, with more time left than the grace) is Slurm's to requeue or cancel:
  # one owner of retries. At the time limit the cell is cut with TERM (the trainer saves what it
  # resumes from) and keeps its claim: the next attempt of this queue re-enters it with {resume}=1.
  stop_plan usr2
  [[ -n $CHILD ]] && kill_cell "$WHY" "$WAIT"
  # A cell whose checkpoint did not change between two time-limit cuts ends here (runner `cut`).
  (( CUT )) && no_progress && how=stopped
  (( CAPPED )) && say "not requeued: this job has restarted $RESTARTS times (slurm.max_restarts $ABLATE_SLURM_MAX_RESTARTS)"
  halt signalled
  ev queue_stop ", \"idx\": $CUR_IDX, \"cell\": $cell, \"reason\": \"$WHY\", \"requeue\": $REQUEUE, \"kill_after\": $WAIT"
  say "${WHY/_/ } ${ATTEMPT:+(job $SLURM_SELF)}: stopped${CUR_CELL:+ (cut $CUR_CELL, $how)}"
  if [[ $WHY == preempted ]]; then
    # A preempted job that ends by itself within GraceTime is COMPLETED, not requeued (Slurm
    # 22.05, PreemptMode=REQUEUE): wait, idle, until Slurm ends it at the end of the grace time,
    # so that its PreemptMode (requeue or cancel) is what happens.
    say "waiting for Slurm to end the preempted job"
    trap 'exit 0' TERM
    while :; do sleep 1; done
  fi
  if (( REQUEUE )); then
    # The same job again, later: its queue goes on from its launch line (published cells are
    # skipped, its claimed ones re-entered). Slurm ends this attempt now.
    say "asking Slurm to requeue job $SLURM_SELF"
    scontrol requeue "$SLURM_SELF" 2>&1 || ev requeue_failed ", \"job\": \"$SLURM_SELF\""
  fi
  exit 0
}
RANG=
trap 'RANG=1' USR1  # the fence's ring: run_cell's wait for its cell is cut short (the runner's watcher)
trap 'on_signal 129' HUP
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
on_exit() {  # the job's last act on Slurm: the session adapter's hook (ABLATE_SLURM_ON_EXIT, set in
  # the job's script by wrappers/slurm_sessions.sh: it submits queues left waiting for a free place
  # under the cluster's submit limits), bounded, whatever ended this shell. The queue has ended:
  # a TERM now (Slurm ending the job, a requeue) is no stop of it, and records nothing more.
  trap '' HUP INT TERM USR2
  ticker_stop
  svc_stop_all
  store_flush
  if [[ -n ${ABLATE_SLURM_ON_EXIT-} && -r $ABLATE_SLURM_ON_EXIT ]]; then
    timeout -k 5 120 bash -- "$ABLATE_SLURM_ON_EXIT" </dev/null 2>&1 | sed 's/^/[ablate on exit] /'
  fi
}
trap on_exit EXIT

say() { { printf '[ablate %s/%s] %s\n' "$ABLATE_HOST" "$QUEUE" "$*"; } 2>/dev/null; }

# ---- the runner's process (ablate/remote/queue/serve.py, deployed as wrappers/runner.<sha12>.pyz:
# docs/ARCHITECTURE.md, "The runner's process"): this shell's co-process for the queue's life, asked
# the walk's steps one per line; the calibration is a process of its own.
DECIDER_PID=
runner_up() {  # the co-process answering decisions, started if it is not running (it ends at our
  # EOF; a KILL to our group ends it too, and the next decision starts another)
  if [[ -n ${DECIDER_PID-} ]] && pid_alive "$DECIDER_PID"; then return 0; fi
  if [[ -n ${DECIDER_PID-} && -n ${DECIDER[1]-} ]]; then  # dead, not yet reaped: its pipes go
    eval "exec ${DECIDER[0]}<&- ${DECIDER[1]}>&-"
  fi
  # shellcheck disable=SC2163  # each is NAME=VALUE
  coproc DECIDER {
    for c in "${STORE_CREDS[@]}"; do export "$c"; done
    runner_exec serve "$ROOT" "$ABLATE_HOST" "$QUEUE" "${SLOT:--}"
  }
}
store_flush() {  # a sweep in a store: the runner's process sends this queue's last events and
  # heartbeat at our EOF; the session ends after that (a reader that finds it gone finds them too)
  [[ -n $ABLATE_STORE && -n ${DECIDER_PID-} ]] || return 0
  local n=0
  [[ -n ${DECIDER[1]-} ]] && { eval "exec ${DECIDER[1]}>&-"; } 2>/dev/null
  while pid_alive "$DECIDER_PID" && (( n++ < 600 )); do sleep 0.1; done
}
DECISION=
ASKED=0
# A signal's handler asks through a Python start of its own (ALONE=1): the running cell's run_one
# may be waiting on the runner's process for an answer (its publish), and two readers of one pipe
# take each other's answers: the handler's plan lost, the publish never answered.
ALONE=
decide() {  # decide VERB ARGS...: DECISION = its answer; rc 0 an answer, 1 nothing to take, else
  # it could not run (3: the FS could not be read, waited for and asked again, up to 3 times)
  local tries=0 starts=0 rc
  while :; do
    ASKED=$((ASKED + 1))
    if [[ -n $ALONE ]]; then
      # shellcheck disable=SC2163  # each is NAME=VALUE
      DECISION=$(for c in "${STORE_CREDS[@]}"; do export "$c"; done
                 runner_exec "$1" "$ROOT" "$ABLATE_HOST" "$QUEUE" "${SLOT:--}" "${@:2}" </dev/null 3>&- 4>&-)
      rc=$?
    else
      runner_up
      ask "q$ASKED" "${DECIDER[1]-}" "${DECIDER[0]-}" "$@"
      rc=$?
    fi
    if (( rc == 125 )); then  # no answer: its process died (OOM, KILL); a new one
      (( starts++ < 2 )) && continue
      return 125
    fi
    (( rc == 3 && tries++ < 3 )) && fs_wait && continue
    return "$rc"
  done
}
helper_failed() {  # the queue's lines could not be read: nothing can be run safely without them
  ev queue_stop ", \"idx\": ${idx:-$START}, \"reason\": \"runner_failed\", \"rc\": $1"
  say "cannot read queue $QUEUE: the runner's decisions (${ABLATE_PYTHON:-python3} $ABLATE_RUNNER_PY) exited $1; is Python 3 on this host (the profile's python), and the shared FS up?"
  halt
  exit 2
}

safe_cell() {  # safe_cell NAME CFG TASK EPOCHS CAT: a decision's cell is what it must be, before a
  # claim, an event or a command
  [[ $1 =~ $NAME_RE && $2 =~ $SAFE && $3 =~ $SAFE && $4 =~ ^[1-9][0-9]{0,6}$ && $5 =~ $SAFE ]]
}

# On a network FS a client's cache may still show a name the server no longer has (a claim that
# remediate released) for the FS's lag: `mkdir` then fails with EEXIST and a stat finds it. Opening
# a file inside asks the server, so a claim's proof is its readable owner.
# A name with no owner is retried for ABLATE_CLAIM_WAIT seconds, above the FS's longest lag
# (ablate/remote/queue/defaults.py says why).
claim() {  # claim NAME IDX: 0 when this call created claims/NAME and owns it
  local waited=0 rc
  # Asked of the runner's process: a sweep kept in a store is claimed there (its conditional create:
  # exactly one claimer gets it); `fs`: on the shared FS, here. No answer (the store unreachable,
  # the runner's process gone) is never "someone's claim": asked again, never a cell passed over.
  until decide claim "$1" "$2"; rc=$?; (( rc < 2 )); do
    say "the runner did not answer the claim of $1 (rc $rc); trying again"
    sleep 5
  done
  [[ $rc == 0 && $DECISION == $'fs\n' ]] || return $(( rc != 0 ))
  until mkdir "$CLAIMS/$1" 2>/dev/null; do
    { : <"$CLAIMS/$1/owner"; } 2>/dev/null && return 1  # someone's claim
    if ! fs_up; then  # the FS is down: wait for it, then try again
      fs_wait || return 1
      continue
    fi
    # No owner: a stale cache of a released claim, or a claimer between its mkdir and its owner.
    # Still none after the FS's longest lag: that claimer ended in between (a queue stopped or
    # cancelled as it took its first cell), and nobody would ever run the cell: taken over, by one
    # claimer only (`own ... take`).
    (( waited++ < ABLATE_CLAIM_WAIT )) || { own "$1" "$2" take; return; }
    sleep 1
  done
  own "$1" "$2" new
}
# own NAME IDX [new|take]: claims/NAME/owner = this host, queue, line, time, attempt and node,
# written to a temp name first. `new` and `take` put it in place by a hard link, which fails when an
# owner is there (link(2) is exclusive, on NFS and sshfs too): of a claimer slower than the wait and
# the ones taking its claim over, exactly one owns it. Where the FS has no hard links, `new` renames
# (as before: nobody can take a claim over there) and `take` gives up. No mode: replace the owner
# (an attempt taking its queue's claims over).
own() {
  local tmp=$CLAIMS/$1/.owner.$QUEUE.${HOSTNAME:--}.$$.$RANDOM err  # a name of its own, on any node
  now
  printf '%s %s %s %s %s %s\n' "$ABLATE_HOST" "$QUEUE" "$2" "$T" "${ATTEMPT:--}" "${HOSTNAME:--}" \
    >"$tmp" || return 1
  if [[ -n ${3-} ]]; then
    if err=$(LC_ALL=C ln -- "$tmp" "$CLAIMS/$1/owner" 2>&1); then
      rm -f -- "$tmp"
      return 0
    fi
    if [[ $3 == take || $err == *"File exists"* ]]; then
      rm -f -- "$tmp"
      return 1
    fi
  fi
  mv -f -- "$tmp" "$CLAIMS/$1/owner"
}
# A batch job Slurm restarted (requeue, preemption, node failure) is a new attempt of the same
# queue: it re-enters the cells its queue claimed, taking them over (`own`), so that only the
# current attempt may publish (run_one checks the owner's attempt before its rename): a stale
# attempt still running on a node cut off from the controller cannot publish over it.
ATTEMPT='' SLURM_SELF='' RESTARTS=0 TOO_OFTEN=0
job_attempt() {  # the runner's `attempt` (ablate/remote/slurm/stop_plan.py), in a Slurm job: ATTEMPT
  # (JOB.RESTARTS), SLURM_SELF (this job as every Slurm verb it runs on itself must name it: `A_i` in
  # an array), RESTARTS, and TOO_OFTEN when that is more than slurm.max_restarts; none outside one
  local rc att='^attempt=([0-9_]+\.[0-9]+) self=([0-9_]+) restarts=([0-9]{1,9}) stop=([01])'
  decide attempt --max-restarts "$ABLATE_SLURM_MAX_RESTARTS"
  rc=$?
  (( rc == 1 )) && return 0  # not a Slurm job
  [[ $rc == 0 && $DECISION =~ $att ]] || helper_failed $(( rc ? rc : 4 ))
  ATTEMPT=${BASH_REMATCH[1]} SLURM_SELF=${BASH_REMATCH[2]} RESTARTS=${BASH_REMATCH[3]} TOO_OFTEN=${BASH_REMATCH[4]}
  export ABLATE_JOB_ATTEMPT=$ATTEMPT
}
write_tail() {  # write_tail NAME: tails/NAME.log = the last 100 lines of the cell's log (tmp + mv)
  local log=$ABLATE_CKPT_ROOT/$1.log tmp=$TAILS/.$1.$ABLATE_HOST.$$.tmp
  if [[ -r $log ]]; then
    tail -n 100 -- "$log" >"$tmp" 2>/dev/null || printf '# ablate: could not read %s\n' "$log" >"$tmp"
  else
    printf '# ablate: no log at %s\n' "$log" >"$tmp"
  fi
  mv -f -- "$tmp" "$TAILS/$1.log" 2>/dev/null || rm -f -- "$tmp"
}

# The fence (ablate/remote/queue/fence.py; docs/ARCHITECTURE.md, "A queue that comes back"): while a
# cell runs, the runner's process checks its claim every heartbeat; when remediate released it or
# another run took it over (this box was paused, or cut off, meanwhile), it writes its verdict to
# FENCE and rings this shell (USR1): a cell with a verdict is stopped.
FENCE=$ABLATE_CKPT_ROOT/.ablate-stop/$ABLATE_HOST.$QUEUE.fence

run_cell() {  # run_cell IDX NAME CFG TASK EPOCHS CAT RESUME [FROM_QUEUE] -- the cell is claimed
  local idx=$1 name=$2 resume=$7 from=${8-} extra='' t0 rc dur again
  [[ -n $from ]] && extra=", \"from_queue\": \"$from\""
  now
  t0=$T
  CUR_IDX=$idx CUR_CELL=$name CUR_STARTED=$t0 FROM_Q=$from CUR_LOG=$ABLATE_CKPT_ROOT/$name.log
  rm -f -- "$ABLATE_STOP_FILE"  # a reason left for an earlier cell is not this one's
  STATE=running
  transition
  ev start ", \"idx\": $idx, \"cell\": \"$name\", \"resume\": $resume$extra"
  decide push  # a sweep in a store: in it before the trainer starts, as on a shared FS
  say "line $idx${from:+ of $from}: $name (resume=$resume)"
  local down=
  if ! svc_up cell; then  # a per-cell service that does not come up: the cell never trained
    ev end ", \"idx\": $idx, \"cell\": \"$name\", \"rc\": 4, \"dur\": 0, \"reason\": \"service_down\", \"service\": \"$SVC_FAILED\"$extra"
    svc_fail "$SVC_FAILED" "$idx"
  fi
  # In the background + wait, so a signal is handled now, not when the cell ends.
  # run_one asks this queue's runner process for its publish, over fds 3 and 4 opened for it alone
  # (a coproc's own fds reach no child; without them, run_one's publish is a Python start).
  local ask=
  decide watch "$name" "$FENCE" "$$"  # its claim watched while it runs
  runner_up && { exec 3>"/proc/$$/fd/${DECIDER[1]}" 4<"/proc/$$/fd/${DECIDER[0]}"; } 2>/dev/null && ask=3,4
  ABLATE_IDX=$idx ABLATE_ASK=$ask bash "$ABLATE_RUN_ONE" "$SPEC" "$name" "$3" "$4" "$5" "$6" "$resume" </dev/null &
  CHILD=$!
  exec 3>&- 4<&-
  # Until it ends: in the background + wait, so a signal is handled now. Woken each second while
  # services run beside it (a death is polled), else only by the fence's USR1 (the runner rings
  # again each heartbeat until the cell has ended, so a ring just before the wait is not lost).
  rc=
  while [[ -z $rc ]]; do
    RANG=
    if pid_alive "$CHILD" && [[ -e $FENCE ]]; then
      say "$name: superseded (its claim is another run's now): stopping it; it does not publish"
      kill_cell superseded
    elif (( ${#SVC_NAMES[@]} )) && [[ -z $down ]] && pid_alive "$CHILD" && svc_dead; then
      down=$REPLY  # a service that died under the cell fails it
      svc_reap "$down"
      SVC_STATE[$down]=down
      ev service_down ", \"service\": \"$down\", \"rc\": ${SVC_RC[$down]}, \"idx\": $idx, \"cell\": \"$name\""
      say "service $down exited (rc ${SVC_RC[$down]}) while $name trained; stopping the cell"
      kill_cell service_down
    fi
    if (( ${#SVC_NAMES[@]} )) && pid_alive "$CHILD"; then
      sleep 1 &
      wait $!
      continue
    fi
    wait "$CHILD"
    rc=$?
    if [[ -n $RANG ]] && (( rc > 128 )); then  # the ring may have cut the wait short
      if pid_alive "$CHILD"; then
        rc=
      else  # it ended meanwhile: its status, unless that wait was its own (127: waited for already)
        wait "$CHILD" 2>/dev/null
        again=$?
        (( again == 127 )) || rc=$again
      fi
    fi
  done
  CHILD=
  # superseded: the runner's fields for its `end` (also when run_one refused to publish, exit 75)
  decide watch - "$FENCE" "$rc" && [[ $DECISION == ', "reason": "superseded"'* ]] && extra+=${DECISION%$'\n'}
  [[ -n $down ]] && extra+=", \"reason\": \"service_down\", \"service\": \"$down\""
  (( rc == 0 )) || write_tail "$name"  # before `end`: a reader that sees the failure finds the tail
  elapsed "$t0"
  dur=$REPLY
  ev end ", \"idx\": $idx, \"cell\": \"$name\", \"rc\": $rc, \"dur\": $dur$extra"
  decide push  # (a store's) its tail and its end, before the next line
  say "line $idx${from:+ of $from}: $name exited $rc after ${dur}s"
  svc_stop_all cell
  CUR_STARTED=
  transition
}
stop_note() {  # stop_note REASON SECONDS: why the cell is stopped and when it is killed, for it
  now
  mkdir -p "${ABLATE_STOP_FILE%/*}" 2>/dev/null
  printf '{"reason": "%s", "t": %s, "kill_after": %s}\n' "$1" "$T" "$2" >"$ABLATE_STOP_FILE.tmp" 2>/dev/null \
    && mv -f "$ABLATE_STOP_FILE.tmp" "$ABLATE_STOP_FILE" 2>/dev/null
}
kill_cell() {  # kill_cell REASON [SECONDS [signalled]]: the running cell's processes (run_one, the
  # trainer): the reason written, TERM (unless `signalled`: Slurm sent it to them already), up to
  # SECONDS (default stop_grace) to save and exit, then KILL
  local p wait=${2:-$ABLATE_STOP_GRACE}
  stop_note "$1" "$wait"
  if [[ ${3-} == signalled ]]; then
    :
  elif [[ $PGID == "$$" ]]; then  # our own group: everyone in it but this shell (services have theirs)
    trap '' TERM
    kill -TERM -- "-$PGID" 2>/dev/null
    trap 'on_signal 143' TERM
  else
    kill -TERM "$CHILD" 2>/dev/null
  fi
  child_gone "$wait"
  if [[ $PGID == "$$" ]]; then
    for p in $(pgrep -g "$PGID" 2>/dev/null); do
      [[ $p == "$$" || $p == "$BASHPID" || $p == "${DECIDER_PID-}" ]] || kill -KILL "$p" 2>/dev/null
    done
  fi
  pid_alive "$CHILD" && kill -KILL "$CHILD" 2>/dev/null
  TICKER=  # the group's TERM ended it: transition starts a new one
}

stop_after_current() {  # stop_after_current IDX: `ablate stop --after-current` asked us to stop
  ev queue_stop ", \"idx\": $1, \"reason\": \"after_current\""
  say "stop requested: not starting line $1"
  halt
  exit 0
}

# ---- calibration (`calibrate:`; docs/ARCHITECTURE.md, "Calibration"): before the first cell, this
# host and slot's measurement (kept from an earlier sweep on this machine, or the user's benchmark
# timed now) and the wait for every other running queue's, in one decision
# (ablate/remote/queue/calibrate.py) run in the background, so that a signal is handled at once.
CAL_EVENT='^, "rc": [0-9]{1,3}, "dur": [0-9]{1,9}(\.[0-9]{1,6})?(, "secs": [0-9]{1,9}\.[0-9]{3}(, "kept": true)?)?$'
calibrate() {
  [[ -n ${ABLATE_CALIBRATE-} && $ABLATE_STEAL != 0 ]] || return 0  # only the head deal uses it
  local f=$ROOT/calib/$ABLATE_HOST.${SLOT:--} out=$ABLATE_CKPT_ROOT/.calibrate.$QUEUE.$$ rc kind rest
  mkdir -p "$ROOT/calib" "$ABLATE_CKPT_ROOT" || return 0
  (
    export ABLATE_CALIBRATE ABLATE_CALIBRATE_TIMEOUT ABLATE_CALIBRATE_KEEP ABLATE_ENV ABLATE_WORKDIR \
      ABLATE_CKPT_ROOT ABLATE_PIN_GPU
    runner_exec calibrate "$ROOT" "$ABLATE_HOST" "$QUEUE" "${SLOT:--}" \
      --secs "${ABLATE_CALIBRATE_WAIT:-$ABLATE_CALIBRATE_TIMEOUT}" --stop "$STOP_FILE"
  ) </dev/null >"$out" &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=
  if (( rc != 0 )); then  # it could not run: marked, so that nobody waits for this host
    printf 'failed %s\n' "$rc" >"$f.tmp.$$" && mv -f -- "$f.tmp.$$" "$f"
    ev calibrate ", \"rc\": $rc, \"dur\": 0"
  fi
  while read -r kind rest; do
    case $kind in
      event) [[ $rest =~ $CAL_EVENT ]] && ev calibrate "$rest" ;;
      waiting) say "still not calibrated: $rest; dealing by their declared speeds" ;;
    esac
  done <"$out"
  rm -f -- "$out"
}

# The runner's process first: a sweep in a store then has a fresh copy (the process claims this
# queue's own files in it before anything is written to them), and its thread sends the
# calibration and pulls the others' meanwhile.
decide pull
svc_layout
job_attempt
hb_write
ev queue_start ", \"start_index\": $START, \"slot\": ${SLOT:-null}, \"pid\": $$, \"pgid\": $PGID, \"run_queue\": \"$RQ_FILE\", \"spec\": \"$SPEC_FILE\"${ATTEMPT:+, \"attempt\": \"$ATTEMPT\", \"node\": \"${HOSTNAME-}\"}"
ticker_start
say "started at line $START (spec $SPEC_FILE)"
if (( TOO_OFTEN )); then  # Slurm restarted it once too often
  ev queue_stop ", \"idx\": $START, \"cell\": null, \"reason\": \"max_restarts\", \"restarts\": $RESTARTS"
  say "not going on: this job has restarted $RESTARTS times, more than slurm.max_restarts ($ABLATE_SLURM_MAX_RESTARTS); its cut cells wait for \`ablate remediate\`"
  halt
  exit 0
fi

export ABLATE_QUEUE=$QUEUE ABLATE_EVENTS=$EVENTS ABLATE_GPU=$SLOT
export ABLATE_RUN_QUEUE_VERSION=$RQ_FILE ABLATE_SPEC_VERSION=$SPEC_FILE
# A slot is a GPU, except on Slurm, where the job's gres sets CUDA_VISIBLE_DEVICES and a slot only
# numbers the host's queues.
if [[ -n $SLOT && $ABLATE_PIN_GPU != 0 ]]; then
  export CUDA_VISIBLE_DEVICES=$SLOT
elif [[ $ABLATE_PIN_GPU == 0 ]]; then
  ABLATE_GPU=${CUDA_VISIBLE_DEVICES-}
fi

trap on_time_limit USR2
[[ -n ${EARLY_USR2-} ]] && on_time_limit  # Slurm's USR2 came before this shell could act on it
calibrate
# ---- the walk (ablate/remote/queue/walk.py, docs/ARCHITECTURE.md "run_queue"): each step asked of the
# runner's process, a short script of what to do, done here in order. Its position is held here
# and sent with each step: a runner process started again goes on from it.
idx=$START
DEFERRED=() AHEAD=()
HEAD=$ABLATE_STEAL  # the shared head's deal: only with calibration and stealing on
[[ -z ${ABLATE_CALIBRATE-} ]] && HEAD=0
OUTCOME=-
while :; do
  if [[ $OUTCOME != drained ]]; then
    NEXT=$idx
    decide pull  # (a store's) the stop file as the store has it now
    [[ -e $STOP_FILE ]] && stop_after_current "$idx"  # before every line, re-entry and steal
    svc_up queue || svc_fail "$SVC_FAILED" "$idx"  # before the first claim; again after one died
  fi
  decide next --at "$idx" --deferred "${DEFERRED[*]-}" --ahead "${AHEAD[*]-}" --head "$HEAD" \
    --steal "$ABLATE_STEAL" --outcome "$OUTCOME" || helper_failed "$?"
  OUTCOME=-
  mapfile -t STEPS <<<"$DECISION"
  for op in "${STEPS[@]}"; do
    read -r kind a b rest <<<"$op"
    case $kind in
      next) [[ $a =~ ^[0-9]{1,9}$ ]] && idx=$a NEXT=$a ;;
      deferred) read -ra DEFERRED <<<"$a $b $rest" ;;
      ahead) read -ra AHEAD <<<"$a $b $rest" ;;
      ev) ev "$a" "${op#"ev $a "}" ;;
      say) say "${op#say }" ;;
      claim)
        [[ $a =~ $NAME_RE && $b =~ ^[0-9]{1,9}$ ]] && claim "$a" "$b" || { OUTCOME=lost; break; }
        OUTCOME=won ;;
      own) [[ -n $ATTEMPT && $a =~ $NAME_RE && $b =~ ^[0-9]{1,9}$ ]] && own "$a" "$b" ;;
      run)
        read -r _ i c1 c2 c3 c4 c5 resume from <<<"$op"
        [[ $i =~ ^[0-9]{1,9}$ && $resume =~ ^[01]$ && ( $from == - || $from =~ $NAME_RE ) ]] \
          && safe_cell "$c1" "$c2" "$c3" "$c4" "$c5" || { say "not run: a bad step from the runner: $op"; break; }
        [[ $from == - ]] && from=''
        run_cell "$i" "$c1" "$c2" "$c3" "$c4" "$c5" "$resume" "$from" ;;
      transition) transition ;;
      drained)  # `ablate append` writes the queue file, then reads this heartbeat: an append
        # that raced the drain is seen by the walk's next read, or append sees "drained"
        STATE=drained CUR_STARTED=
        ticker_stop
        svc_stop_all
        hb_write
        OUTCOME=drained ;;
      running)
        STATE=running
        hb_write
        ticker_start ;;
      end) exit 0 ;;
    esac
  done
done
exit
}
