#!/usr/bin/env bash
# ablate run_one: train one cell, then publish its durable copy on the shared FS.
#
#   bash run_one.<sha12>.sh SPEC NAME CFG TASK EPOCHS CAT RESUME
#
# Exit code: the train command's; 3 when training succeeded but the sync failed (the
# instance-local checkpoint is left intact); 75 when the run was superseded (its claim is another
# run's now: it does not publish); 125 when this wrapper could not set up the run.
# Formats (MANIFEST.json, events): docs/ARCHITECTURE.md. Plain bash 5 + coreutils; the sync's file
# work (copies, checks, MANIFEST.json) is the runner's Python (ablate/remote/queue/publish.py).
# One compound command, parsed whole before any of it runs: bash reads a script as it goes, and
# this file is on the shared FS, which can go away mid-run (an outage of a network FS).
{
set -u
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2: `&` in a ${x//p/r} replacement is literal

if (( $# != 7 )); then
  echo "usage: run_one.sh SPEC NAME CFG TASK EPOCHS CAT RESUME" >&2
  exit 125
fi
SPEC=$1 NAME=$2 CFG=$3 TASK=$4 EPOCHS=$5 CAT=$6 RESUME=$7
# shellcheck source=/dev/null
source "$SPEC" || { echo "run_one: cannot read the run spec $SPEC" >&2; exit 125; }
[[ ${ABLATE_FS_WAIT-} =~ ^[0-9]{1,7}$ ]] || { echo "run_one: the run spec $SPEC has no ABLATE_FS_WAIT: deploy again" >&2; exit 125; }

QUEUE=${ABLATE_QUEUE:--}
EVENTS=${ABLATE_EVENTS:-$ABLATE_ROOT/events/$ABLATE_HOST.$QUEUE.jsonl}
GPU=${ABLATE_GPU-}
CKPT_DIR=$ABLATE_CKPT_ROOT/$NAME
LOG=$ABLATE_CKPT_ROOT/$NAME.log
SELF=${BASH_SOURCE[0]##*/}

# shellcheck source=wrappers/common.sh
source "${BASH_SOURCE[0]%/*}/common.sh"  # ablate: inline (deploy puts wrappers/common.sh here)

mkdir -p "$CKPT_DIR" || { echo "run_one: cannot create $CKPT_DIR" >&2; exit 125; }

# A sweep kept in an object store, on an instance whose clone of the repo lacks the cell's config:
# the copy launch put in the store (cfgs/<cfg>), fetched into the workdir first.
if [[ -n ${ABLATE_STORE-} && $CFG != /* && $CFG != *..* && ! -e $ABLATE_WORKDIR/$CFG ]]; then
  ask_runner "f$$" config "$CFG" "$ABLATE_WORKDIR"
  rc=$?
  (( rc == 0 )) || { echo "run_one: $CFG is neither in $ABLATE_WORKDIR nor in the store (rc $rc)" >&2; exit 125; }
fi

# The cell's resume state (ablate/remote/resume/keeper.py): its newest durable copy restored when
# {ckpt_dir} holds nothing to resume from, RESUME 1 when something is there now; while the trainer
# runs, the queue's runner process copies each new complete checkpoint to the sweep.
RSPEC=("$CKPT_DIR" "${ABLATE_RESUME:--}" "${ABLATE_RESUME_PICK:-newest}")
RUN_ID='' ATTEMPT_NO=1 STEP=''
if ask_runner "r$$" resume-prep "$NAME" "${RSPEC[0]}" "$RESUME" "${RSPEC[@]:1}" \
    && [[ $DECISION =~ ^resume=([01])\ attempt=([0-9]{1,9})\ run_id=([0-9a-f]{16})\ step=([0-9]{0,12})\ ev=([^$'\n']*) ]]; then
  RESUME=${BASH_REMATCH[1]} ATTEMPT_NO=${BASH_REMATCH[2]} RUN_ID=${BASH_REMATCH[3]} STEP=${BASH_REMATCH[4]}
  [[ ${BASH_REMATCH[5]} != - ]] && ev restore ", \"cell\": \"$NAME\", ${BASH_REMATCH[5]}"
  [[ $DECISION == *$'\n'?* ]] && printf '%s' "${DECISION#*$'\n'}" >>"$LOG"
fi
export ABLATE_RUN_ID=$RUN_ID ABLATE_ATTEMPT=$ATTEMPT_NO ABLATE_RESUME_STEP=$STEP

# Render the train template. Field values were validated to [A-Za-z0-9._/+@,=-] before launch.
cmd=$ABLATE_TRAIN
cmd=${cmd//"{cfg}"/"$CFG"}
cmd=${cmd//"{task}"/"$TASK"}
cmd=${cmd//"{epochs}"/"$EPOCHS"}
cmd=${cmd//"{name}"/"$NAME"}
cmd=${cmd//"{ckpt_dir}"/"$CKPT_DIR"}
cmd=${cmd//"{cat}"/"$CAT"}
cmd=${cmd//"{resume}"/"$RESUME"}
cmd=${cmd//"{gpu}"/"$GPU"}
cmd=${cmd//"{run_id}"/"$RUN_ID"}
cmd=${cmd//"{attempt}"/"$ATTEMPT_NO"}
first=1
for kv in ${ABLATE_PORTS-}; do  # `name=port ...` from run_queue (services:); the first is {port}
  (( first )) && cmd=${cmd//"{port}"/"${kv#*=}"}
  first=0
  cmd=${cmd//"{port_${kv%%=*}}"/"${kv#*=}"}
done

now
STARTED=$T
printf '# ablate %s host=%s queue=%s cell=%s resume=%s gpu=%s\n# ablate cmd: %s\n' \
  "$STARTED" "$ABLATE_HOST" "$QUEUE" "$NAME" "$RESUME" "${GPU:-none}" "$cmd" >>"$LOG" \
  || { echo "run_one: cannot write $LOG" >&2; exit 125; }
# A stop's TERM reaches the whole group, the trainer too: this shell and the one below wait for the
# trainer to save and exit (run_queue and `ablate stop` KILL it after the grace), then say it was
# cut. A trapped signal is the default again in the trainer.
CUT=
trap 'CUT=1' TERM
[[ -n $CUT ]] && exit 143  # stopped before the trainer started: it never starts
(
  trap 'exit 143' TERM  # before the trainer: it never starts; while it runs: once it has ended
  cd -- "$ABLATE_WORKDIR" || exit 125
  set +u  # activation scripts (conda) reference unset variables
  if [[ -n ${ABLATE_ENV-} ]]; then
    eval "$ABLATE_ENV" || { echo "ablate: env activation failed: $ABLATE_ENV"; exit 125; }
  fi
  eval "$cmd"
) </dev/null >>"$LOG" 2>&1 3>&- 4>&-  # (3 and 4: the queue's runner process, not the trainer's)
rc=$?
# The keeper stops; a cell that did not succeed has its last checkpoint copied if it is new. A
# stopped one asks through a Python start of its own: Slurm's TERM reached the queue's shell too,
# which may be asking the runner's process now, and two askers must not share its pipe.
if [[ -n $CUT ]]; then ABLATE_ASK='' ask_runner "r$$" resume-end "$NAME" "$rc" "${RSPEC[@]}"
else ask_runner "r$$" resume-end "$NAME" "$rc" "${RSPEC[@]}"; fi && [[ -n $DECISION ]] && printf '%s' "$DECISION" >>"$LOG"
now
ENDED=$T
printf '# ablate end %s rc=%s\n' "$ENDED" "$rc" >>"$LOG"
if [[ -n $CUT ]]; then  # stopped mid-run: never a result, whatever the trainer returned
  printf '# ablate: the cell was stopped (TERM); %s\n' "$(cat -- "${ABLATE_STOP_FILE:-/nonexistent}" 2>/dev/null)" >>"$LOG"
  exit 143
fi
(( rc == 0 )) || exit "$rc"

# ---- sync: copy, check size + sha256 of each copy against its source, then publish by rename.
FINAL_PARENT=$ABLATE_ROOT/final_ckpts
FINAL=$FINAL_PARENT/$NAME
STAGING=
SYNC_TRIES=0
fail() {
  [[ -n $STAGING ]] && rm -rf -- "$STAGING" 2>/dev/null
  STAGING=
  # The FS went away mid-copy (a network FS's outage): wait for it and copy again, from scratch.
  if (( SYNC_TRIES < 3 )) && ! fs_up; then
    SYNC_TRIES=$((SYNC_TRIES + 1))
    printf '# ablate: the shared FS did not answer while syncing (%s); waiting for it\n' "$1" >>"$LOG"
    fs_wait && sync_all  # exits
  fi
  jstr "$1"
  ev sync_failed ", \"cell\": \"$NAME\", \"reason\": $REPLY"
  printf '# ablate sync failed: %s\n' "$1" >>"$LOG"
  exit 3
}
synced() {  # published: the cell's resume copies go (nothing resumes from them any more)
  ev synced ", \"cell\": \"$NAME\""
  ask_runner "r$$" resume-drop "$NAME"
  exit 0
}
ours() {  # the published result is this very run's (a rename whose answer the outage lost)
  local m=  # read by bash itself: no process per cell (MANIFEST.json is one line)
  { IFS= read -r -d '' m <"$FINAL/MANIFEST.json"; } 2>/dev/null
  [[ $m == *"\"host\": \"$ABLATE_HOST\""* && $m == *"\"started\": $STARTED,"* ]]
}
sync_all() {  # stage, check, publish; exits 0 (synced) or through fail
  if [[ -n ${ABLATE_STORE-} ]]; then
    :  # a sweep kept in a store: its commit is the one check (commit below)
  elif [[ -e $FINAL ]]; then
    (( SYNC_TRIES )) && ours && synced
    fail "final_ckpts/$NAME already exists; a durable result is never overwritten"
  fi
  STAGING=$FINAL_PARENT/.staging.$NAME.$ABLATE_HOST.$$
  if ! mkdir -- "$STAGING" 2>/dev/null; then  # one process when final_ckpts/ is there, as it mostly is
    mkdir -p -- "$FINAL_PARENT" || fail "cannot create $FINAL_PARENT"
    rm -rf -- "$STAGING"
    mkdir -- "$STAGING" || fail "cannot create $STAGING"
  fi
  # The checkpoint entries resolved, each file copied and its size + sha256 compared with the
  # source's, the metrics file's and the log's too, MANIFEST.json (docs/ARCHITECTURE.md).
  # Every value as --opt=value: one starting with "-" is never taken for an option.
  local reason rc args=(--staging="$STAGING" --ckpt-dir="$CKPT_DIR" --log="$LOG"
    --checkpoint="$ABLATE_CHECKPOINT" --pick="${ABLATE_PICK:-all}" --metrics="${ABLATE_METRICS-}"
    --workdir="$ABLATE_WORKDIR" --host="$ABLATE_HOST" --queue="$QUEUE" --started="$STARTED"
    --ended="$ENDED" --wrapper="$SELF" --run-queue="${ABLATE_RUN_QUEUE_VERSION-}"
    --spec="${ABLATE_SPEC_VERSION-}" -- "$NAME" "$CFG" "$TASK" "$EPOCHS" "$CAT" "$RESUME")
  ask_runner "c$$" publish "${args[@]}" 2>>"$LOG"  # the queue's runner process: no Python start
  rc=$?
  reason=${DECISION%%$'\n'*}
  (( rc == 0 )) || fail "${reason:-publish (${ABLATE_RUNNER_PY-}) exited $rc; see the log}"
  # A run whose claim remediate released or another run took over (this box was paused or cut off
  # meanwhile: ablate/remote/queue/fence.py) never publishes: exit 75, nothing recorded as a failure.
  ask_runner "f$$" fence "$NAME" 2>>"$LOG"
  if (( $? == 1 )); then
    printf '# ablate: %s\n' "${DECISION%%$'\n'*}" >>"$LOG"
    rm -rf -- "$STAGING"
    exit 75
  fi
  [[ -n ${ABLATE_STORE-} ]] && commit_to_store  # exits

  # -T: never move *into* an existing dir; -n: never replace one (renameat2 NOREPLACE where the FS has
  # it).
  [[ -e $FINAL ]] && fail "final_ckpts/$NAME appeared while syncing; a durable result is never overwritten"
  # A Slurm attempt publishes only while the claim is its own: a newer attempt of the queue (the job
  # requeued while this one was cut off) took the cell over, and only it may publish.
  if [[ -n ${ABLATE_JOB_ATTEMPT-} ]]; then
    local o_attempt=
    { read -r _ _ _ _ o_attempt _ <"$ABLATE_ROOT/claims/$NAME/owner"; } 2>/dev/null
    [[ $o_attempt == "$ABLATE_JOB_ATTEMPT" ]] \
      || fail "fenced: attempt ${o_attempt:-?} owns the claim of $NAME now, not this run's ($ABLATE_JOB_ATTEMPT); it does not publish"
  fi
  mv -T -n -- "$STAGING" "$FINAL" 2>/dev/null
  # Published means this run's MANIFEST.json opens under the final name (asked of the server: a
  # cached stat of the staging dir could say it moved when the outage cut the rename).
  ours || fail "could not rename $STAGING to final_ckpts/$NAME (it exists now?)"
  STAGING=
  synced
}
commit_to_store() {  # the staged files uploaded, then the one conditional commit
  # (ablate/remote/store/queue_side.py): asked of the queue's runner process, else a Python start of its own
  local reason rc
  ask_runner "k$$" commit "$NAME" "$STAGING" "$STARTED" 2>>"$LOG"
  rc=$?
  reason=${DECISION%%$'\n'*}
  (( rc == 0 )) || fail "${reason:-the commit to the store exited $rc; see the log}"
  rm -rf -- "$STAGING"
  STAGING=
  synced
}
sync_all
exit
}
