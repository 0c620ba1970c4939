# shellcheck shell=bash
# What run_queue.sh and run_one.sh share, written once: `ablate deploy` puts this file in place of
# each wrapper's `source .../common.sh  # ablate: inline` line (ablate/run/placement.py), so that a
# deployed wrapper stays one file, one compound command parsed whole. Needs ABLATE_ROOT,
# ABLATE_HOST, QUEUE and EVENTS.
now() { T=${EPOCHREALTIME/,/.}; }  # some locales print a decimal comma
# A network FS's outage (sshfs, NFS): calls block, then fail (EIO) until its server is back. No
# line of the sweep's record may be lost to it: wait for the FS (a file made and removed: a real
# round trip, never a cached stat), at most ABLATE_FS_WAIT seconds (the run spec's:
# ablate/remote/store/client.py FS_WAIT), then write again.
fs_up() { local p=$ABLATE_ROOT/.up.$ABLATE_HOST.$BASHPID; { : >"$p" && rm -f -- "$p"; } 2>/dev/null; }
fs_wait() {
  local until=$((SECONDS + ABLATE_FS_WAIT))
  until fs_up; do
    (( SECONDS < until )) || return 1
    sleep 2
  done
}
ev() {  # ev KIND ', "key": value, ...' -- one JSON line, one O_APPEND write (again after an outage)
  local line tries=0
  now
  printf -v line '{"t": %s, "ev": "%s", "host": "%s", "queue": "%s"%s}\n' \
    "$T" "$1" "$ABLATE_HOST" "$QUEUE" "${2-}"
  # A retry starts with a newline: a write torn by the outage never swallows this line.
  until printf '%s' "$line" >>"$EVENTS" 2>/dev/null; do
    (( ++tries <= 3 )) && fs_wait || { printf 'ablate: could not record %s: %s' "$1" "$line" >&2; return 1; }
    line=$'\n'$line
  done
}
jstr() {  # a JSON string literal in REPLY (reasons can quote a path)
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  REPLY="\"${s//[[:cntrl:]]/ }\""
}
runner_exec() {  # runner_exec VERB ARGS...: becomes the runner's process (ablate/remote/queue/serve.py,
  # in the zipapp the spec names) with the profile's env and python; call it in a subshell
  if [[ -n ${ABLATE_ENV-} ]]; then
    set +u  # activation scripts (conda) reference unset variables
    eval "$ABLATE_ENV" >/dev/null 2>&1 </dev/null || { echo "ablate: env activation failed: $ABLATE_ENV" >&2; exit 125; }
  fi
  # -S: no site-packages to import at each start, but where the sweep is kept in an object store:
  # boto3 lives there
  local nosite=-S
  [[ -n ${ABLATE_STORE-} ]] && nosite=
  # shellcheck disable=SC2086  # the profile's python may be a command with arguments
  exec ${ABLATE_PYTHON:-python3} $nosite "$ABLATE_RUNNER_PY" "$@"
}
ask() {  # ask ID TO FROM VERB ARGS...: one request of the queue's runner process (runner.py serve)
  # over the fds TO and FROM; DECISION = its answer, rc its own; 125 when none came (the process is
  # gone). Answers to other IDs (a run_one killed while it waited) are skipped.
  local id=$1 to=$2 from=$3 req line rc=125
  shift 3
  printf -v req '%s\t' "$id" "$@"
  [[ $req == *$'\n'* ]] && return 125  # (no value holds one: checked where they come from)
  DECISION=''
  trap '' PIPE  # a process gone: the write fails, this shell lives
  if { printf '%s\n' "${req%$'\t'}" 1>&"$to"; } 2>/dev/null; then
    while IFS= read -r -u "$from" line; do
      if [[ $line =~ ^\.done\ ([0-9]{1,3})\ (.*)$ ]]; then
        [[ ${BASH_REMATCH[2]} == "$id" ]] && { rc=${BASH_REMATCH[1]}; break; }
        DECISION=''
        continue
      fi
      DECISION+=$line$'\n'
    done
  fi
  trap - PIPE
  return "$rc"
}
ask_runner() {  # ask_runner ID VERB ARGS...: one request of the queue's runner process over the fds
  # 3 and 4 run_queue opened for this process (ABLATE_ASK=3,4), else (none given, or its process is
  # gone) a Python start of its own; DECISION = the answer, rc its own (0 done, 1 refused). The verbs
  # of a sweep's store take the queue's ROOT HOST QUEUE SLOT when started alone; publish does not.
  local id=$1 rc=125
  shift
  if [[ ${ABLATE_ASK-} == 3,4 ]]; then
    ask "$id" 3 4 "$@"
    rc=$?
  fi
  (( rc == 0 || rc == 1 )) && return "$rc"
  [[ -n ${ABLATE_RUNNER_PY-} ]] || { DECISION="the run spec names no runner (ABLATE_RUNNER_PY): deploy again"; return 125; }
  local -a base=("$ABLATE_ROOT" "$ABLATE_HOST" "${QUEUE:--}" -)
  [[ $1 == publish ]] && base=()
  DECISION=$(runner_exec "$1" "${base[@]}" "${@:2}" </dev/null 3>&- 4>&-)
}
