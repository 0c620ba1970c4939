#!/usr/bin/env bash
# ablate run_one: train one cell, then publish its durable copy on the shared FS.
#
#   bash run_one.<sha12>.sh SPEC NAME CFG TASK EPOCHS CAT RESUME
#
# Exit code: the train command's; 3 when training succeeded but the sync failed (the
# instance-local checkpoint is left intact); 125 when this wrapper could not set up the run.
# Formats (MANIFEST.json, events): docs/ARCHITECTURE.md. Plain bash 5 + coreutils.
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

QUEUE=${ABLATE_QUEUE:--}
EVENTS=${ABLATE_EVENTS:-$ABLATE_ROOT/events/$ABLATE_HOST.$QUEUE.jsonl}
GPU=${ABLATE_GPU-}
CKPT_DIR=$ABLATE_CKPT_ROOT/$NAME
LOG=$ABLATE_CKPT_ROOT/$NAME.log
SELF=${BASH_SOURCE[0]##*/}

# shellcheck source=wrappers/common.sh
source "${BASH_SOURCE[0]%/*}/common.sh"  # ablate: inline (deploy puts wrappers/common.sh here)

mkdir -p "$CKPT_DIR" || { echo "run_one: cannot create $CKPT_DIR" >&2; exit 125; }

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
(
  cd -- "$ABLATE_WORKDIR" || exit 125
  set +u  # activation scripts (conda) reference unset variables
  if [[ -n ${ABLATE_ENV-} ]]; then
    eval "$ABLATE_ENV" || { echo "ablate: env activation failed: $ABLATE_ENV"; exit 125; }
  fi
  eval "$cmd"
) </dev/null >>"$LOG" 2>&1
rc=$?
now
ENDED=$T
printf '# ablate end %s rc=%s\n' "$ENDED" "$rc" >>"$LOG"
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
ours() {  # the published result is this very run's (a rename whose answer the outage lost)
  local m=$FINAL/MANIFEST.json
  grep -qF "\"host\": \"$ABLATE_HOST\"" "$m" 2>/dev/null && grep -qF "\"started\": $STARTED," "$m" 2>/dev/null
}

ck_add() {  # ck_add PATH [in-dir]: one checkpoint file, once, by its path relative to CKPT_DIR
  local rel=${1#"$CKPT_DIR"/}
  # A file named (or matched) must have content; a directory may hold empty files (markers).
  [[ -n ${2-} || -s $1 ]] || fail "checkpoint $rel missing or empty in $CKPT_DIR"
  # Recorded in MANIFEST.json as is: no quote, backslash or control character to escape.
  [[ $rel == *[[:cntrl:]\"\\]* ]] && fail "checkpoint file name ${rel//[[:cntrl:]]/?} has a quote, backslash or control character; rename it"
  [[ -n ${CK_SEEN[$rel]-} || $rel == "${ABLATE_METRICS-}" ]] && return 0
  CK_SEEN[$rel]=1
  CK_FILES+=("$rel")
}
ck_resolve() {  # CK_FILES: the files ABLATE_CHECKPOINT's entries name now (docs/ARCHITECTURE.md)
  local entry m f newest n
  local -a entries matches
  CK_FILES=()
  declare -gA CK_SEEN=()
  read -ra entries <<<"$ABLATE_CHECKPOINT"
  for entry in "${entries[@]}"; do
    if [[ $entry == *[*?[]* ]]; then
      shopt -s nullglob
      # shellcheck disable=SC2206  # unquoted on purpose: expanded as a glob (entries hold no blanks)
      matches=("$CKPT_DIR"/$entry)
      shopt -u nullglob
      (( ${#matches[@]} )) || fail "checkpoint $entry matches nothing in $CKPT_DIR"
      if [[ ${ABLATE_PICK:-all} == newest ]]; then
        newest=${matches[0]}
        for m in "${matches[@]}"; do [[ $m -nt $newest ]] && newest=$m; done
        matches=("$newest")
      fi
    else
      matches=("$CKPT_DIR/$entry")
    fi
    for m in "${matches[@]}"; do
      if [[ -d $m ]]; then
        n=${#CK_FILES[@]}
        while IFS= read -r -d '' f; do ck_add "$f" in-dir; done < <(find "$m" -type f -print0 | LC_ALL=C sort -z)
        (( ${#CK_FILES[@]} > n )) || fail "checkpoint directory ${m#"$CKPT_DIR"/} has no files in $CKPT_DIR"
      elif [[ -f $m ]]; then
        ck_add "$m"
      else
        fail "checkpoint ${m#"$CKPT_DIR"/} missing or empty in $CKPT_DIR"
      fi
    done
  done
}

sync_all() {  # copy, check, publish; exits 0 (synced) or through fail
  ARTIFACTS=
  ck_resolve
  if [[ -n ${ABLATE_METRICS-} ]]; then
    [[ -f $CKPT_DIR/$ABLATE_METRICS && -s $CKPT_DIR/$ABLATE_METRICS ]] \
      || fail "metrics $ABLATE_METRICS missing or empty in $CKPT_DIR"
  fi
  if [[ -e $FINAL ]]; then
    (( SYNC_TRIES )) && ours && { ev synced ", \"cell\": \"$NAME\""; exit 0; }
    fail "final_ckpts/$NAME already exists; a durable result is never overwritten"
  fi
  mkdir -p "$FINAL_PARENT" || fail "cannot create $FINAL_PARENT"
  STAGING=$FINAL_PARENT/.staging.$NAME.$ABLATE_HOST.$$
  rm -rf -- "$STAGING"
  mkdir "$STAGING" || fail "cannot create $STAGING"

  copy_checked() {  # copy_checked SRC REL: its manifest entry in REPLY
    local src=$1 rel=$2 dst=$STAGING/$2 size dsize sum dsum
    if [[ $rel == */* ]]; then mkdir -p -- "${dst%/*}" || fail "cannot create ${dst%/*}"; fi
    cp -- "$src" "$dst" || fail "copy of $rel to the shared FS failed"
    size=$(stat -c %s -- "$src") && dsize=$(stat -c %s -- "$dst") || fail "cannot stat $rel"
    [[ $size == "$dsize" ]] || fail "copy of $rel is short: $dsize of $size bytes"
    sum=$(sha256sum -- "$src") && dsum=$(sha256sum -- "$dst") || fail "cannot hash $rel"
    sum=${sum%% *} dsum=${dsum%% *}
    [[ $sum == "$dsum" ]] || fail "copy of $rel differs from its source (sha256 $dsum, expected $sum)"
    REPLY="{\"file\": \"$rel\", \"size\": $size, \"sha256\": \"$sum\"}"
  }
  # One plain file configured and found: recorded as one object (as ever); else a list of them.
  local ck='' rel
  for rel in "${CK_FILES[@]}"; do
    copy_checked "$CKPT_DIR/$rel" "$rel"
    ck+="${ck:+, }$REPLY"
  done
  [[ ${#CK_FILES[@]} == 1 && ${CK_FILES[0]} == "$ABLATE_CHECKPOINT" ]] || ck="[$ck]"
  ARTIFACTS="\"checkpoint\": $ck"
  if [[ -n ${ABLATE_METRICS-} ]]; then
    copy_checked "$CKPT_DIR/$ABLATE_METRICS" "$ABLATE_METRICS"
    ARTIFACTS+=", \"metrics\": $REPLY"
  fi
  copy_checked "$LOG" "$NAME.log"
  ARTIFACTS+=", \"log\": $REPLY"

  cfg_path=$CFG
  [[ $CFG == /* ]] || cfg_path=$ABLATE_WORKDIR/$CFG
  cfg_sha=null
  if [[ -f $cfg_path && -r $cfg_path ]] && s=$(sha256sum -- "$cfg_path" 2>/dev/null); then
    cfg_sha="\"${s%% *}\""
  fi
  commit=null
  if command -v git >/dev/null 2>&1 && c=$(git -C "$ABLATE_WORKDIR" rev-parse HEAD 2>/dev/null) \
      && [[ $c =~ ^[0-9a-f]{40}$ ]]; then
    commit="\"$c\""
  fi
  sha12_of() {  # the version in a content-addressed file name (run_one.<sha12>.sh, <sha12>.env)
    if [[ $1 =~ ^(run_one\.|run_queue\.)?([0-9a-f]{12})\.(sh|env)$ ]]; then
      REPLY="\"${BASH_REMATCH[2]}\""
    else
      REPLY=null
    fi
  }
  sha12_of "$SELF"; v_one=$REPLY
  sha12_of "${ABLATE_RUN_QUEUE_VERSION-}"; v_queue=$REPLY
  sha12_of "${ABLATE_SPEC_VERSION-}"; v_spec=$REPLY

  printf '{"name": "%s", "cfg": "%s", "task": "%s", "epochs": %s, "cat": "%s", "cfg_sha256": %s, "wrapper_version": %s, "run_queue_version": %s, "spec_version": %s, "host": "%s", "queue": "%s", "commit": %s, "started": %s, "ended": %s, "resume": %s, "artifacts": {%s}}\n' \
    "$NAME" "$CFG" "$TASK" "$EPOCHS" "$CAT" "$cfg_sha" "$v_one" "$v_queue" "$v_spec" "$ABLATE_HOST" \
    "$QUEUE" "$commit" "$STARTED" "$ENDED" "$RESUME" "$ARTIFACTS" >"$STAGING/MANIFEST.json" \
    || fail "cannot write MANIFEST.json in $STAGING"

  # -T: never move *into* an existing dir; -n: never replace one (renameat2 NOREPLACE where the FS has
  # it).
  [[ -e $FINAL ]] && fail "final_ckpts/$NAME appeared while syncing; a durable result is never overwritten"
  # A Slurm attempt publishes only while the claim is its own: a newer attempt of the queue (the job
  # requeued while this one was cut off) took the cell over, and only it may publish.
  if [[ -n ${ABLATE_ATTEMPT-} ]]; then
    local o_attempt=
    { read -r _ _ _ _ o_attempt _ <"$ABLATE_ROOT/claims/$NAME/owner"; } 2>/dev/null
    [[ $o_attempt == "$ABLATE_ATTEMPT" ]] \
      || fail "fenced: attempt ${o_attempt:-?} owns the claim of $NAME now, not this run's ($ABLATE_ATTEMPT); it does not publish"
  fi
  mv -T -n -- "$STAGING" "$FINAL" 2>/dev/null
  # Published means this run's MANIFEST.json opens under the final name (asked of the server: a
  # cached stat of the staging dir could say it moved when the outage cut the rename).
  ours || fail "could not rename $STAGING to final_ckpts/$NAME (it exists now?)"
  STAGING=
  ev synced ", \"cell\": \"$NAME\""
  exit 0
}
sync_all
exit
}
