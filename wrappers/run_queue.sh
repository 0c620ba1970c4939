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
# the stdlib-only ablate/remote/serve.py run as this shell's co-process for the queue's life: each
# step a short script of what to do, done here in order; no decision costs a Python start. Values
# from the spec and the walk are safe by construction ([A-Za-z0-9._/+@,=-], checked again here),
# so they go into JSON and commands without escaping.
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
# shellcheck source=/dev/null
source "$SPEC" || { echo "run_queue: cannot read the run spec $SPEC" >&2; exit 2; }

SAFE='^[A-Za-z0-9._/+@,=-]+$'
ROOT=$ABLATE_ROOT
# A sweep kept in an object store (ABLATE_STORE, docs/ARCHITECTURE.md "The object store"): ROOT is
# this instance's own copy of it, kept in step with the store by the runner's process (pull before each
# step, what this queue writes sent as it is written; claims and results go to the store itself).
# Credentials given at launch arrive through a FIFO, `NAME=VALUE` lines (AWS_* only) then EOF: held in
# this shell unexported and handed to the runner's process alone (never the trainer's environment,
# never a file).
STORE=${ABLATE_STORE-}
export ABLATE_STORE=$STORE ABLATE_STORE_ENDPOINT=${ABLATE_STORE_ENDPOINT-}
STORE_CREDS=()
if [[ -n ${ABLATE_CREDS_FIFO-} && -p $ABLATE_CREDS_FIFO ]]; then
  while IFS= read -r cred; do
    [[ $cred =~ ^AWS_[A-Z_]{1,40}=[^[:cntrl:]]{0,4096}$ ]] && STORE_CREDS+=("$cred")
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
HB_SECS=${ABLATE_HEARTBEAT_SECS:-10}
[[ $HB_SECS =~ ^[0-9]{1,6}$ ]] || HB_SECS=10
STEAL=${ABLATE_STEAL:-1}
export ABLATE_TASK_EPOCHS=${ABLATE_TASK_EPOCHS-} ABLATE_HEARTBEAT_SECS=$HB_SECS  # for the decisions

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

# ---- services beside the trainer (docs/ARCHITECTURE.md, "Services"): each in its own process
# group (stopped as a whole: TERM, ABLATE_SVC_GRACE seconds, KILL), its log instance-local under
# $ABLATE_CKPT_ROOT/.ablate-services/, its state in the heartbeat.
read -ra SVC_NAMES <<<"${ABLATE_SERVICES-}"
ABLATE_PORTS=
declare -A SVC_PID=() SVC_STATE=() SVC_PORT=() SVC_GPU=() SVC_STARTS=() SVC_RC=()
SVC_DIR=$ABLATE_CKPT_ROOT/.ablate-services
# Why the running cell is being stopped, for the trainer to read on its TERM (README, "Stopping a
# cell"): one JSON line {"reason", "t", "kill_after"} written before the TERM whenever this queue or
# `ablate stop` sends it; removed before each cell starts.
export ABLATE_STOP_FILE=$ABLATE_CKPT_ROOT/.ablate-stop/$ABLATE_HOST.$QUEUE
STOP_GRACE=${ABLATE_STOP_GRACE:-120}
[[ $STOP_GRACE =~ ^[0-9]+$ ]] || STOP_GRACE=120
SVC_WHY=
svc_layout() {  # this queue's ports (base + K) and each service's GPUs, from ABLATE_SVC_SLOTS
  local entry rest k=0 i=0 name base
  local -a per=()
  for entry in ${ABLATE_SVC_SLOTS-}; do
    rest=${entry#*:}
    if [[ ${entry%%:*} == "${SLOT:--}" ]]; then
      k=${rest%%:*}
      IFS=/ read -ra per <<<"${rest#*:}"
      break
    fi
  done
  for name in "${SVC_NAMES[@]}"; do
    base=ABLATE_SVC_${name}_PORT
    SVC_PORT[$name]=$(( ${!base} + k ))
    SVC_GPU[$name]=${per[i]-}
    SVC_STATE[$name]=off SVC_STARTS[$name]=0
    ABLATE_PORTS+="${ABLATE_PORTS:+ }$name=${SVC_PORT[$name]}"
    i=$((i + 1))
  done
  export ABLATE_PORTS  # run_one fills the train template's {port} and {port_<name>} from it
}
svc_json() {  # REPLY = the services' JSON object for the heartbeat (null without services)
  local name pid out=
  REPLY=null
  (( ${#SVC_NAMES[@]} )) || return 0
  for name in "${SVC_NAMES[@]}"; do
    pid=${SVC_PID[$name]:-null}
    out+="${out:+, }\"$name\": {\"state\": \"${SVC_STATE[$name]}\", \"port\": ${SVC_PORT[$name]}, \"gpus\": \"${SVC_GPU[$name]}\", \"pid\": $pid, \"starts\": ${SVC_STARTS[$name]}}"
  done
  REPLY="{$out}"
}
svc_render() {  # svc_render NAME TEMPLATE: REPLY with {port} {gpu} {name} filled in
  REPLY=${2//"{port}"/"${SVC_PORT[$1]}"}
  REPLY=${REPLY//"{gpu}"/"${SVC_GPU[$1]}"}
  REPLY=${REPLY//"{name}"/"$1"}
}
svc_log() { REPLY=$SVC_DIR/$QUEUE.$1.log; }
http_ok() {  # http_ok URL: a 2xx answer within 5 s (curl, else bash's /dev/tcp for plain http)
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -o /dev/null --max-time 5 -- "$1" 2>/dev/null
    return
  fi
  [[ $1 =~ ^http://([^/:]+)(:([0-9]+))?(/.*)?$ ]] || return 1
  timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$3" "$1" >&3
    read -r _ code _ <&3
    [[ $code == 2?? ]]' ablate-http "${BASH_REMATCH[1]}" "${BASH_REMATCH[3]:-80}" "${BASH_REMATCH[4]:-/}" 2>/dev/null
}
pid_alive() {  # pid_alive PID: still running (not exited, not a zombie waiting for us)
  local st
  [[ -n $1 ]] && { read -r st </proc/$1/stat; } 2>/dev/null || return 1
  st=${st##*) }
  [[ ${st:0:1} != Z ]]
}
svc_alive() { pid_alive "${SVC_PID[$1]-}"; }
svc_reap() {  # svc_reap NAME: its exit code in SVC_RC (a JSON number or null) once it is gone
  local pid=${SVC_PID[$1]-}
  SVC_RC[$1]=null
  if [[ -n $pid ]]; then
    wait "$pid" 2>/dev/null
    SVC_RC[$1]=$?
  fi
}
svc_start() {  # svc_start NAME: launched (state starting); its readiness is svc_wait's
  local name=$1 cmd_var=ABLATE_SVC_${1}_CMD gpus=${SVC_GPU[$1]}
  svc_render "$name" "${!cmd_var}"
  local cmd=$REPLY
  svc_log "$name"
  local log=$REPLY
  mkdir -p -- "$SVC_DIR" 2>/dev/null
  now
  printf '# ablate service %s start %s host=%s queue=%s port=%s gpus=%s\n# ablate cmd: %s\n' \
    "$name" "$T" "$ABLATE_HOST" "$QUEUE" "${SVC_PORT[$name]}" "${gpus:-none}" "$cmd" >>"$log" 2>/dev/null
  # setsid: a session and process group of its own (a background job here is never a group
  # leader, so setsid execs in place and $! is the group's id).
  setsid bash -c 'cd -- "$1" || exit 125
    set +u
    if [[ -n $2 ]]; then eval "$2" || { echo "ablate: env activation failed: $2"; exit 125; }; fi
    if [[ $3 == 1 ]]; then export CUDA_VISIBLE_DEVICES=$4; fi
    eval "$5"' ablate-service "$ABLATE_WORKDIR" "${ABLATE_ENV-}" "${SLOT:+1}" "$gpus" "$cmd" \
    </dev/null >>"$log" 2>&1 &
  SVC_PID[$name]=$!
  SVC_STATE[$name]=starting
  SVC_STARTS[$name]=$(( SVC_STARTS[$name] + 1 ))
  ev service_start ", \"service\": \"$name\", \"pid\": $!, \"port\": ${SVC_PORT[$name]}, \"gpus\": \"$gpus\""
}
svc_wait() {  # svc_wait NAME: 0 once it answers; 1 (SVC_WHY) when it exits or its time-out passes
  local name=$1 t_var=ABLATE_SVC_${1}_TIMEOUT http_var=ABLATE_SVC_${1}_HTTP r_var=ABLATE_SVC_${1}_READY
  local until=$(( SECONDS + ${!t_var} )) url rcmd
  svc_render "$name" "${!http_var-}"; url=$REPLY
  svc_render "$name" "${!r_var-}"; rcmd=$REPLY
  svc_log "$name"
  local log=$REPLY
  while :; do
    if [[ -n $url ]]; then
      http_ok "$url" && break
    elif (cd -- "$ABLATE_WORKDIR" && timeout 30 bash -c "$rcmd") </dev/null >>"$log" 2>&1; then
      break
    fi
    if ! svc_alive "$name"; then
      svc_reap "$name"
      SVC_WHY="exited (rc ${SVC_RC[$name]}) before it was ready"
      return 1
    fi
    (( SECONDS < until )) || { SVC_WHY="not ready after ${!t_var}s"; return 1; }
    sleep 1 &
    wait $!
  done
  SVC_STATE[$name]=ready
  ev service_ready ", \"service\": \"$name\", \"port\": ${SVC_PORT[$name]}"
  say "service $name ready on port ${SVC_PORT[$name]}"
  return 0
}
svc_stop() {  # svc_stop NAME: TERM its group, ABLATE_SVC_GRACE s, then KILL; state stopped
  local name=$1 pid=${SVC_PID[$1]-} waited=0
  [[ -n $pid ]] || return 0
  kill -TERM -- "-$pid" 2>/dev/null
  while svc_alive "$name" && (( waited++ < ${ABLATE_SVC_GRACE:-10} * 5 )); do sleep 0.2; done
  kill -KILL -- "-$pid" 2>/dev/null
  svc_reap "$name"
  SVC_PID[$name]=
  [[ ${SVC_STATE[$name]} == down || ${SVC_STATE[$name]} == failed ]] || SVC_STATE[$name]=stopped
}
svc_stop_all() {  # every running service of this queue (at exit, stop, or around a cell)
  local name scope=${1-}
  for name in "${SVC_NAMES[@]}"; do
    local s_var=ABLATE_SVC_${name}_SCOPE
    [[ -z $scope || ${!s_var} == "$scope" ]] || continue
    svc_stop "$name"
  done
}
svc_fail() {  # svc_fail NAME: the queue stops at line $idx, before its next cell, with the log's tail
  local name=$1 tail_text='' line
  svc_log "$name"
  local log=$REPLY out=$ROOT/services/$ABLATE_HOST.$QUEUE.$name.log
  SVC_STATE[$name]=failed
  mkdir -p -- "$ROOT/services" 2>/dev/null
  tail -n 100 -- "$log" >"$out.tmp.$$" 2>/dev/null && mv -f -- "$out.tmp.$$" "$out" 2>/dev/null
  rm -f -- "$out.tmp.$$" 2>/dev/null
  while IFS= read -r line; do
    [[ $line == '# ablate '* ]] || tail_text+="${tail_text:+ | }$line"
  done < <(tail -n 5 -- "$log" 2>/dev/null)
  jstr "${tail_text:0:600}"
  ev service_failed ", \"idx\": $idx, \"service\": \"$name\", \"reason\": \"$SVC_WHY\", \"tail\": $REPLY"
  say "service $name $SVC_WHY; stopping the queue (log: $log)"
  halt
  ev queue_stop ", \"idx\": $idx, \"reason\": \"service_failed\", \"service\": \"$name\""
  exit 4
}
SVC_FAILED=
svc_up() {  # svc_up SCOPE: start every service of that scope not running and wait until it is
  # ready; 1 (SVC_FAILED, SVC_WHY) when one is not
  local name s_var
  for name in "${SVC_NAMES[@]}"; do
    s_var=ABLATE_SVC_${name}_SCOPE
    [[ ${!s_var} == "$1" ]] || continue
    svc_alive "$name" && [[ ${SVC_STATE[$name]} == ready ]] && continue
    if [[ ${SVC_STATE[$name]} == ready ]]; then  # died between cells
      svc_reap "$name"
      ev service_down ", \"service\": \"$name\", \"rc\": ${SVC_RC[$name]}, \"cell\": null"
      say "service $name exited (rc ${SVC_RC[$name]}) between cells; restarting it"
    fi
    svc_stop "$name"  # whatever is left of it
    svc_start "$name"
    transition
    if ! svc_wait "$name"; then
      SVC_FAILED=$name
      return 1
    fi
    transition
  done
}
svc_dead() {  # REPLY = the first service that was ready and is gone; 1 when all are up
  local name
  for name in "${SVC_NAMES[@]}"; do
    if [[ ${SVC_STATE[$name]} == ready ]] && ! svc_alive "$name"; then
      REPLY=$name
      return 0
    fi
  done
  return 1
}

# A background ticker rewrites the heartbeat every ABLATE_HEARTBEAT_SECS. It is restarted at each
# transition, so it always holds the current state and the heartbeat has one writer at a time.
TICKER=
ticker_start() {
  (
    sp=
    trap '[[ -n $sp ]] && kill "$sp" 2>/dev/null; exit 0' TERM
    while :; do
      sleep "${ABLATE_HEARTBEAT_SECS:-10}" &
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
STOP_MARGIN=10  # seconds of Slurm's window kept for this shell's own ending (events, heartbeat)
cut_cell() {  # the running cell as a JSON value (null between cells), for a stop's event
  if [[ -n $CUR_STARTED && -n $CUR_CELL ]]; then printf '"%s"' "$CUR_CELL"; else printf null; fi
}
child_gone() {  # child_gone SECONDS: wait up to SECONDS for the running cell (run_one) to end
  local n=0
  while pid_alive "$CHILD" && (( n++ < $1 * 5 )); do sleep 0.2; done
}
slurm_window() {  # REPLY = the seconds Slurm gives the job's processes after its first signal
  REPLY=30
  decide window && [[ $DECISION =~ ^[0-9]{1,7}$ ]] && REPLY=$DECISION
  (( REPLY > STOP_MARGIN + 1 )) && REPLY=$(( REPLY - STOP_MARGIN )) || REPLY=1
}
on_signal() {  # `ablate stop` (TERM to the group), tmux kill-session (HUP), Ctrl-C, Slurm's TERM
  trap '' HUP INT TERM
  if [[ -n $ATTEMPT && -n $CHILD ]]; then
    # Slurm's TERM (scancel, a preemption without a user signal) reached every process of the job;
    # the job ends when this shell does, so it waits for the cell through the site's window
    # (GraceTime + KillWait), then kills what is left. The cut cell keeps its claim.
    slurm_window
    ev queue_stop ", \"idx\": ${CUR_IDX:-null}, \"cell\": $(cut_cell), \"reason\": \"slurm_signal\", \"kill_after\": $REPLY"
    kill_cell slurm_signal "$REPLY" signalled
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
  [[ -n $CHILD ]] && child_gone "$STOP_GRACE"
  halt signalled
  exit "$1"
}
slurm_left() {  # REPLY = the seconds this job has left by squeue (%L); 1 when unknown
  local t
  REPLY=
  t=$(squeue -h -j "$SLURM_SELF" -o %L 2>/dev/null) || return 1
  [[ $t =~ ^(([0-9]+)-)?(([0-9]+):)?([0-9]+):([0-9]+)$ ]] || return 1
  REPLY=$(( ((10#${BASH_REMATCH[2]:-0} * 24 + 10#${BASH_REMATCH[4]:-0}) * 60 + 10#${BASH_REMATCH[5]}) * 60 \
            + 10#${BASH_REMATCH[6]} ))
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
  local kind earlier fp
  decide cut --cell "$CUR_CELL" --attempt "$ATTEMPT" --ckpt-dir "$ABLATE_CKPT_ROOT/$CUR_CELL" \
    --checkpoint "${ABLATE_CHECKPOINT-}" || return 1
  read -r kind earlier fp <<<"$DECISION"
  [[ $kind == stuck && $earlier =~ ^[0-9_]+\.[0-9]+$ && $fp =~ ^[0-9a-z]+$ ]] || return 1
  write_tail "$CUR_CELL"
  elapsed "$CUR_STARTED"
  ev end ", \"idx\": $CUR_IDX, \"cell\": \"$CUR_CELL\", \"rc\": 124, \"dur\": $REPLY, \"reason\": \"no_progress\", \"since\": \"$earlier\", \"checkpoint\": \"$fp\"${FROM_Q:+, \"from_queue\": \"$FROM_Q\"}"
  say "$CUR_CELL: its checkpoint is as the time limit of attempt $earlier left it: it needs more than time - grace, or its trainer does not resume; stopped, for \`ablate remediate\`"
}
on_time_limit() {  # Slurm's --signal=B:USR2@grace: the time limit is near, or the job is preempted
  trap '' USR2 HUP INT TERM
  local cell why=time_limit requeue=${ABLATE_SLURM_RESUBMIT:-0}
  cell=$(cut_cell)
  # The signal comes at most 60 s before `grace`: with more time left than that, the site's
  # preemption sent it (PreemptParameters=send_user_signal), and Slurm's preemption decides what
  # becomes of the job (requeue or cancel): one owner of retries, so we ask for nothing.
  local left=${ABLATE_SLURM_GRACE:-120}
  if [[ -n $ATTEMPT ]] && slurm_left; then
    left=$REPLY
    (( REPLY > ${ABLATE_SLURM_GRACE:-120} + 90 )) && why=preempted requeue=0
  fi
  # The cell is cut with TERM (the trainer saves what it resumes from) and keeps its claim: the
  # next attempt of this queue re-enters it with {resume}=1. It has until a margin before Slurm's
  # own end of the job (the time left, or the preemption's grace) to save and exit.
  if [[ $why == preempted ]]; then
    slurm_window
  else
    REPLY=$(( left > STOP_MARGIN + 1 ? left - STOP_MARGIN : 1 ))
  fi
  local wait=$REPLY cut=resumable
  [[ -n $CHILD ]] && kill_cell "$why" "$wait"
  # A cell whose checkpoint did not change between two time-limit cuts ends here (runner `cut`).
  [[ $why == time_limit && $cell != null && -n $ATTEMPT ]] && no_progress && cut=stopped
  if [[ $requeue == 1 && -n $ATTEMPT ]] && (( RESTARTS >= MAX_RESTARTS )); then
    requeue=0
    say "not requeued: this job has restarted $RESTARTS times (slurm.max_restarts $MAX_RESTARTS)"
  fi
  halt signalled
  ev queue_stop ", \"idx\": $CUR_IDX, \"cell\": $cell, \"reason\": \"$why\", \"requeue\": $requeue, \"kill_after\": $wait"
  say "${why/_/ } ${ATTEMPT:+(job $SLURM_SELF)}: stopped${CUR_CELL:+ (cut $CUR_CELL, $cut)}"
  if [[ $why == preempted ]]; then
    # A preempted job that ends by itself within GraceTime is COMPLETED, not requeued (Slurm
    # 22.05, PreemptMode=REQUEUE): wait, idle, until Slurm ends it at the end of the grace time,
    # so that its PreemptMode (requeue or cancel) is what happens.
    say "waiting for Slurm to end the preempted job"
    trap 'exit 0' TERM
    while :; do sleep 1; done
  fi
  if [[ $requeue == 1 && -n $ATTEMPT ]]; then
    # The same job again, later: its queue goes on from its launch line (published cells are
    # skipped, its claimed ones re-entered). Slurm ends this attempt now.
    say "asking Slurm to requeue job $SLURM_SELF"
    scontrol requeue "$SLURM_SELF" 2>&1 || ev requeue_failed ", \"job\": \"$SLURM_SELF\""
  fi
  exit 0
}
trap on_time_limit USR2
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

# ---- the runner's process (ablate/remote/serve.py, deployed as wrappers/runner.<sha12>.pyz:
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
  [[ -n $STORE && -n ${DECIDER_PID-} ]] || return 0
  local n=0
  [[ -n ${DECIDER[1]-} ]] && { eval "exec ${DECIDER[1]}>&-"; } 2>/dev/null
  while pid_alive "$DECIDER_PID" && (( n++ < 600 )); do sleep 0.1; done
}
DECISION=
ASKED=0
decide() {  # decide VERB ARGS...: DECISION = its answer; rc 0 an answer, 1 nothing to take, else
  # it could not run (3: the FS could not be read, waited for and asked again, up to 3 times)
  local tries=0 starts=0 rc
  while :; do
    ASKED=$((ASKED + 1))
    runner_up
    ask "q$ASKED" "${DECIDER[1]-}" "${DECIDER[0]-}" "$@"
    rc=$?
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
# Seconds a name with no owner is retried: above the longest cache a default mount keeps (NFS's
# acdirmax, sshfs or FUSE set to 60 s), with margin, as doctor's cap. At 60 s, a claim remediate had
# released could still look present when the wait ended; the takeover then wrote into a directory
# the server no longer had, and the cell was skipped.
CLAIM_WAIT=${ABLATE_CLAIM_WAIT:-150}
claim() {  # claim NAME IDX: 0 when this call created claims/NAME and owns it
  local waited=0 rc
  if [[ -n $STORE ]]; then  # the store's conditional create: exactly one claimer gets it
    while :; do
      decide claim "$1" "$2"
      rc=$?
      (( rc < 2 )) && return "$rc"
      say "the store did not take the claim of $1 (rc $rc); trying again"
      sleep 5
    done
  fi
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
    (( waited++ < CLAIM_WAIT )) || { own "$1" "$2" take; return; }
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
ATTEMPT=
# This job as every Slurm verb it runs on itself must name it: in an array `A_i`, since a bare A is
# the array's id, which names every task (the first task's own SLURM_JOB_ID is that id).
SLURM_SELF=
if [[ ${SLURM_JOB_ID-} =~ ^[0-9_]+$ ]]; then
  ATTEMPT=$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}
  [[ $ATTEMPT =~ ^[0-9_]+\.[0-9]+$ ]] || ATTEMPT=$SLURM_JOB_ID.0
  SLURM_SELF=$SLURM_JOB_ID
  if [[ ${SLURM_ARRAY_JOB_ID-} =~ ^[0-9]+$ && ${SLURM_ARRAY_TASK_ID-} =~ ^[0-9]+$ ]]; then
    SLURM_SELF=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
  fi
fi
export ABLATE_ATTEMPT=$ATTEMPT
RESTARTS=${ATTEMPT##*.}  # this job's restarts so far (its attempt's count)
MAX_RESTARTS=${ABLATE_SLURM_MAX_RESTARTS:-10}
[[ $MAX_RESTARTS =~ ^[0-9]{1,6}$ ]] || MAX_RESTARTS=10
write_tail() {  # write_tail NAME: tails/NAME.log = the last 100 lines of the cell's log (tmp + mv)
  local log=$ABLATE_CKPT_ROOT/$1.log tmp=$TAILS/.$1.$ABLATE_HOST.$$.tmp
  if [[ -r $log ]]; then
    tail -n 100 -- "$log" >"$tmp" 2>/dev/null || printf '# ablate: could not read %s\n' "$log" >"$tmp"
  else
    printf '# ablate: no log at %s\n' "$log" >"$tmp"
  fi
  mv -f -- "$tmp" "$TAILS/$1.log" 2>/dev/null || rm -f -- "$tmp"
}

run_cell() {  # run_cell IDX NAME CFG TASK EPOCHS CAT RESUME [FROM_QUEUE] -- the cell is claimed
  local idx=$1 name=$2 resume=$7 from=${8-} extra='' t0 rc dur
  [[ -n $from ]] && extra=", \"from_queue\": \"$from\""
  now
  t0=$T
  CUR_IDX=$idx CUR_CELL=$name CUR_STARTED=$t0 FROM_Q=$from CUR_LOG=$ABLATE_CKPT_ROOT/$name.log
  rm -f -- "$ABLATE_STOP_FILE"  # a reason left for an earlier cell is not this one's
  STATE=running
  transition
  ev start ", \"idx\": $idx, \"cell\": \"$name\", \"resume\": $resume$extra"
  [[ -n $STORE ]] && decide push  # in the store before the trainer starts, as on a shared FS
  say "line $idx${from:+ of $from}: $name (resume=$resume)"
  local down=
  if ! svc_up cell; then  # a per-cell service that does not come up: the cell never trained
    ev end ", \"idx\": $idx, \"cell\": \"$name\", \"rc\": 4, \"dur\": 0, \"reason\": \"service_down\", \"service\": \"$SVC_FAILED\"$extra"
    svc_fail "$SVC_FAILED"
  fi
  # In the background + wait, so a signal is handled now, not when the cell ends.
  # run_one asks this queue's runner process for its publish, over fds 3 and 4 opened for it alone
  # (a coproc's own fds reach no child; without them, run_one's publish is a Python start).
  local ask=
  runner_up && { exec 3>"/proc/$$/fd/${DECIDER[1]}" 4<"/proc/$$/fd/${DECIDER[0]}"; } 2>/dev/null && ask=3,4
  ABLATE_IDX=$idx ABLATE_ASK=$ask bash "$ABLATE_RUN_ONE" "$SPEC" "$name" "$3" "$4" "$5" "$6" "$resume" </dev/null &
  CHILD=$!
  exec 3>&- 4<&-
  if (( ${#SVC_NAMES[@]} )); then  # a service that dies under the cell fails it as service_down
    while pid_alive "$CHILD"; do
      if svc_dead; then
        down=$REPLY
        svc_reap "$down"
        SVC_STATE[$down]=down
        ev service_down ", \"service\": \"$down\", \"rc\": ${SVC_RC[$down]}, \"idx\": $idx, \"cell\": \"$name\""
        say "service $down exited (rc ${SVC_RC[$down]}) while $name trained; stopping the cell"
        kill_cell service_down
        break
      fi
      sleep 1 &
      wait $!
    done
  fi
  wait "$CHILD"
  rc=$?
  CHILD=
  [[ -n $down ]] && extra+=", \"reason\": \"service_down\", \"service\": \"$down\""
  (( rc == 0 )) || write_tail "$name"  # before `end`: a reader that sees the failure finds the tail
  elapsed "$t0"
  dur=$REPLY
  ev end ", \"idx\": $idx, \"cell\": \"$name\", \"rc\": $rc, \"dur\": $dur$extra"
  [[ -n $STORE ]] && decide push  # its tail and its end, before the next line
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
  local p wait=${2:-$STOP_GRACE}
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
# timed now) and the wait for every other running queue's, in one decision (ablate/remote/
# calibrate.py) run in the background, so that a signal is handled at once.
CAL_EVENT='^, "rc": [0-9]{1,3}, "dur": [0-9]{1,9}(\.[0-9]{1,6})?(, "secs": [0-9]{1,9}\.[0-9]{3}(, "kept": true)?)?$'
calibrate() {
  [[ -n ${ABLATE_CALIBRATE-} && $STEAL != 0 ]] || return 0  # only the head deal uses it
  local f=$ROOT/calib/$ABLATE_HOST.${SLOT:--} out=$ABLATE_CKPT_ROOT/.calibrate.$QUEUE.$$ rc kind rest
  mkdir -p "$ROOT/calib" "$ABLATE_CKPT_ROOT" || return 0
  (
    export ABLATE_CALIBRATE ABLATE_CALIBRATE_TIMEOUT ABLATE_CALIBRATE_KEEP ABLATE_ENV ABLATE_WORKDIR \
      ABLATE_CKPT_ROOT ABLATE_PIN_GPU
    runner_exec calibrate "$ROOT" "$ABLATE_HOST" "$QUEUE" "${SLOT:--}" \
      --secs "${ABLATE_CALIBRATE_WAIT:-${ABLATE_CALIBRATE_TIMEOUT:-600}}" --stop "$STOP_FILE"
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

# A sweep in a store: the runner's process first (it claims this queue's own files in the copy,
# before anything is written to them) and a fresh copy.
[[ -n $STORE ]] && decide pull
svc_layout
hb_write
ev queue_start ", \"start_index\": $START, \"slot\": ${SLOT:-null}, \"pid\": $$, \"pgid\": $PGID, \"run_queue\": \"$RQ_FILE\", \"spec\": \"$SPEC_FILE\"${ATTEMPT:+, \"attempt\": \"$ATTEMPT\", \"node\": \"${HOSTNAME-}\"}"
ticker_start
say "started at line $START (spec $SPEC_FILE)"
if [[ -n $ATTEMPT ]] && (( RESTARTS > MAX_RESTARTS )); then  # Slurm restarted it once too often
  ev queue_stop ", \"idx\": $START, \"cell\": null, \"reason\": \"max_restarts\", \"restarts\": $RESTARTS"
  say "not going on: this job has restarted $RESTARTS times, more than slurm.max_restarts ($MAX_RESTARTS); its cut cells wait for \`ablate remediate\`"
  halt
  exit 0
fi

export ABLATE_QUEUE=$QUEUE ABLATE_EVENTS=$EVENTS ABLATE_GPU=$SLOT
export ABLATE_RUN_QUEUE_VERSION=$RQ_FILE ABLATE_SPEC_VERSION=$SPEC_FILE
# A slot is a GPU, except on Slurm, where the job's gres sets CUDA_VISIBLE_DEVICES and a slot only
# numbers the host's queues.
if [[ -n $SLOT && ${ABLATE_PIN_GPU:-1} != 0 ]]; then
  export CUDA_VISIBLE_DEVICES=$SLOT
elif [[ ${ABLATE_PIN_GPU:-1} == 0 ]]; then
  ABLATE_GPU=${CUDA_VISIBLE_DEVICES-}
fi

[[ -n $STORE ]] && runner_up  # its thread sends the calibration and pulls the others' meanwhile
calibrate
# ---- the walk (ablate/remote/walk.py, docs/ARCHITECTURE.md "run_queue"): each step asked of the
# runner's process, a short script of what to do, done here in order. Its position is held here
# and sent with each step: a runner process started again goes on from it.
idx=$START
DEFERRED=() AHEAD=()
HEAD=1  # the shared head's deal: only with calibration and stealing on
[[ $STEAL == 0 || -z ${ABLATE_CALIBRATE-} ]] && HEAD=0
STEAL_ON=1
[[ $STEAL == 0 ]] && STEAL_ON=0
OUTCOME=-
while :; do
  if [[ $OUTCOME != drained ]]; then
    NEXT=$idx
    [[ -n $STORE ]] && decide pull  # the stop file as the store has it now
    [[ -e $STOP_FILE ]] && stop_after_current "$idx"  # before every line, re-entry and steal
    svc_up queue || svc_fail "$SVC_FAILED"  # before the first claim; again after one died
  fi
  decide next --at "$idx" --deferred "${DEFERRED[*]-}" --ahead "${AHEAD[*]-}" --head "$HEAD" \
    --steal "$STEAL_ON" --outcome "$OUTCOME" || helper_failed "$?"
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
