#!/usr/bin/env bash
# ablate run_queue: run the cells of one queue file in order, one at a time, on this host.
#
#   bash run_queue.<sha12>.sh SPEC QUEUE START_INDEX [SLOT]
#
# Formats of everything written here (claims, events, heartbeat) are in docs/ARCHITECTURE.md.
# Plain bash 5 + coreutils: no Python start-up per event. Values from the spec and the queue are
# safe by construction ([A-Za-z0-9._/+@,=-]), so they go into JSON and commands without escaping;
# lines that do not match are skipped with reason "invalid", never executed.
set -u
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2: `&` in a ${x//p/r} replacement is literal

if (( $# < 3 || $# > 4 )); then
  echo "usage: run_queue.sh SPEC QUEUE START_INDEX [SLOT]" >&2
  exit 2
fi
SPEC=$1 QUEUE=$2 START=$3 SLOT=${4-}
if [[ ! $START =~ ^[0-9]+$ || ( -n $SLOT && ! $SLOT =~ ^[0-9]+$ ) ]]; then
  echo "run_queue: START_INDEX and SLOT must be whole numbers, got '$START' '$SLOT'" >&2
  exit 2
fi
# shellcheck source=/dev/null
source "$SPEC" || { echo "run_queue: cannot read the run spec $SPEC" >&2; exit 2; }

SAFE='^[A-Za-z0-9._/+@,=-]+$'
ROOT=$ABLATE_ROOT
QFILE=$ROOT/queues/$QUEUE.txt
EVENTS=$ROOT/events/$ABLATE_HOST.$QUEUE.jsonl
HB=$ROOT/heartbeats/$ABLATE_HOST.$QUEUE
HB_TMP_PREFIX=$ROOT/heartbeats/.$ABLATE_HOST.$QUEUE
CLAIMS=$ROOT/claims
FINAL=$ROOT/final_ckpts
RQ_FILE=${BASH_SOURCE[0]##*/}
SPEC_FILE=${SPEC##*/}
mkdir -p "$ROOT/events" "$ROOT/heartbeats" "$CLAIMS" "$FINAL" || {
  echo "run_queue: cannot create directories under $ROOT" >&2
  exit 2
}

declare -A TASK_EPOCHS=()
for kv in ${ABLATE_TASK_EPOCHS-}; do
  TASK_EPOCHS[${kv%%=*}]=${kv#*=}
done

# The process group is what `ablate stop` kills: fields after "(comm)" in /proc/PID/stat are
# state, ppid, pgrp.
PGID=
if read -r stat 2>/dev/null </proc/$$/stat; then
  read -r _ _ PGID _ <<<"${stat##*) }"
fi
[[ $PGID =~ ^[0-9]+$ ]] || PGID=$(ps -o pgid= -p $$ 2>/dev/null | tr -d ' ')
[[ $PGID =~ ^[0-9]+$ ]] || PGID=null

now() { T=${EPOCHREALTIME/,/.}; }  # some locales print a decimal comma

ev() {  # ev KIND ', "key": value, ...' -- one JSON line, one O_APPEND write
  now
  printf '{"t": %s, "ev": "%s", "host": "%s", "queue": "%s"%s}\n' \
    "$T" "$1" "$ABLATE_HOST" "$QUEUE" "${2-}" >>"$EVENTS"
}

STATE=running CUR_IDX=$START CUR_CELL= CUR_STARTED=
hb_write() {  # the heartbeat file, tmp + mv: readers never see half of it; its mtime is the beat
  local cell=null started=null slot=null tmp=$HB_TMP_PREFIX.$BASHPID.tmp
  [[ -n $CUR_CELL ]] && cell="\"$CUR_CELL\""
  [[ -n $CUR_STARTED ]] && started=$CUR_STARTED
  [[ -n $SLOT ]] && slot=$SLOT
  now
  printf '{"t": %s, "host": "%s", "queue": "%s", "slot": %s, "pid": %s, "pgid": %s, "state": "%s", "idx": %s, "cell": %s, "cell_started": %s, "run_queue": "%s", "spec": "%s"}\n' \
    "$T" "$ABLATE_HOST" "$QUEUE" "$slot" "$$" "$PGID" "$STATE" "$CUR_IDX" "$cell" "$started" \
    "$RQ_FILE" "$SPEC_FILE" >"$tmp" && mv -f "$tmp" "$HB"
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
ticker_stop() {
  if [[ -n $TICKER ]]; then
    kill "$TICKER" 2>/dev/null
    wait "$TICKER" 2>/dev/null
    rm -f "$HB_TMP_PREFIX.$TICKER.tmp"
    TICKER=
  fi
}
transition() { ticker_stop; hb_write; ticker_start; }

CHILD=
on_signal() {  # `ablate stop` (TERM to the group), tmux kill-session (HUP), Ctrl-C
  trap '' HUP INT TERM
  # The running cell stops with the queue. Under tmux this shell leads its own process group;
  # started any other way, only our own child is signalled, never a group we do not own.
  if [[ $PGID == "$$" ]]; then
    kill -TERM -- "-$PGID" 2>/dev/null
  elif [[ -n $CHILD ]]; then
    kill -TERM "$CHILD" 2>/dev/null
  fi
  ticker_stop
  STATE=stopped CUR_STARTED=
  hb_write
  exit "$1"
}
trap 'on_signal 129' HUP
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'ticker_stop' EXIT

say() { { printf '[ablate %s/%s] %s\n' "$ABLATE_HOST" "$QUEUE" "$*"; } 2>/dev/null; }

LINE=
read_line() {  # read_line IDX: re-reads the FS queue file (appends are seen); sets LINE, CR-free
  local -a rows=()
  mapfile -t rows 2>/dev/null <"$QFILE" || return 1
  (( $1 < ${#rows[@]} )) || return 1
  LINE=${rows[$1]//$'\r'/}
}

hb_write
now
ev queue_start ", \"start_index\": $START, \"slot\": ${SLOT:-null}, \"pid\": $$, \"pgid\": $PGID, \"run_queue\": \"$RQ_FILE\", \"spec\": \"$SPEC_FILE\""
ticker_start
say "started at line $START (spec $SPEC_FILE)"

export ABLATE_QUEUE=$QUEUE ABLATE_EVENTS=$EVENTS ABLATE_GPU=$SLOT
export ABLATE_RUN_QUEUE_VERSION=$RQ_FILE ABLATE_SPEC_VERSION=$SPEC_FILE
[[ -n $SLOT ]] && export CUDA_VISIBLE_DEVICES=$SLOT

idx=$START
while :; do
  if ! read_line "$idx"; then
    STATE=drained CUR_STARTED=
    ticker_stop
    hb_write
    # `ablate append` writes the queue file, then reads this heartbeat: an append that raced the
    # drain decision is seen by this second read, or append sees "drained" and restarts us.
    if read_line "$idx"; then
      STATE=running
      hb_write
      ticker_start
      continue
    fi
    ev queue_end ", \"idx\": $idx"
    say "drained at line $idx"
    exit 0
  fi
  CUR_IDX=$idx
  set -f
  # shellcheck disable=SC2206  # word splitting of a queue line is the point; globbing is off
  parts=($LINE)
  set +f
  if (( ${#parts[@]} == 0 )) || [[ ${parts[0]} == \#* ]]; then
    idx=$((idx + 1))
    continue
  fi
  cfg=${parts[0]} task=${parts[1]-} epochs=${parts[2]-}
  base=${cfg##*/}
  name=${base%.*}
  [[ $base == *.* && -n $name ]] || name=$base
  valid=0
  if (( ${#parts[@]} <= 3 )) && [[ $cfg =~ $SAFE && $task =~ $SAFE && -n ${TASK_EPOCHS[$task]+set} ]]; then
    [[ -n $epochs ]] || epochs=${TASK_EPOCHS[$task]}
    [[ $epochs =~ ^[1-9][0-9]*$ && $name =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] && valid=1
  fi
  if (( ! valid )); then
    ev skip ", \"idx\": $idx, \"cell\": null, \"reason\": \"invalid\""
    say "line $idx: not <cfg> <task> [epochs] with a known task; skipped"
    idx=$((idx + 1))
    continue
  fi
  cat=
  if [[ $cfg == */* ]]; then
    cat=${cfg%/*}
    while [[ $cat == */ ]]; do cat=${cat%/}; done
    cat=${cat##*/}
  fi
  [[ -n $cat ]] || cat=default

  if [[ -e $FINAL/$name/MANIFEST.json ]]; then
    ev skip ", \"idx\": $idx, \"cell\": \"$name\", \"reason\": \"done\""
    idx=$((idx + 1))
    continue
  fi
  if mkdir "$CLAIMS/$name" 2>/dev/null; then
    now
    printf '%s %s %s %s\n' "$ABLATE_HOST" "$QUEUE" "$idx" "$T" >"$CLAIMS/$name/.owner.$$" \
      && mv -f "$CLAIMS/$name/.owner.$$" "$CLAIMS/$name/owner"
    resume=0
  else
    o_host= o_queue=
    { read -r o_host o_queue _ <"$CLAIMS/$name/owner"; } 2>/dev/null
    if [[ $o_host == "$ABLATE_HOST" && $o_queue == "$QUEUE" ]]; then
      resume=1  # ours, interrupted (or failed): re-enter with the checkpoint dir intact
    else
      ev skip ", \"idx\": $idx, \"cell\": \"$name\", \"reason\": \"claimed\""
      idx=$((idx + 1))
      continue
    fi
  fi

  now
  t0=$T
  CUR_CELL=$name CUR_STARTED=$t0 STATE=running
  transition
  ev start ", \"idx\": $idx, \"cell\": \"$name\", \"resume\": $resume"
  say "line $idx: $name (resume=$resume)"
  # In the background + wait, so a signal is handled now, not when the cell ends.
  ABLATE_IDX=$idx bash "$ABLATE_RUN_ONE" "$SPEC" "$name" "$cfg" "$task" "$epochs" "$cat" "$resume" </dev/null &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=
  now
  us=$(( ${T/./} - ${t0/./} ))
  printf -v dur '%d.%06d' $((us / 1000000)) $((us % 1000000))
  ev end ", \"idx\": $idx, \"cell\": \"$name\", \"rc\": $rc, \"dur\": $dur"
  say "line $idx: $name exited $rc after ${dur}s"
  CUR_STARTED=
  transition
  idx=$((idx + 1))
done
