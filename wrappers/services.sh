# shellcheck shell=bash
# run_queue's services beside the trainer (docs/ARCHITECTURE.md, "Services"): each in its own process
# group (stopped as a whole: TERM, ABLATE_SVC_GRACE seconds, KILL), its log instance-local under
# $ABLATE_CKPT_ROOT/.ablate-services/, its state in the heartbeat. Apart from the queue's own life:
# `ablate deploy` puts this file in place of run_queue's `source .../services.sh  # ablate: inline`
# line (ablate/run/placement.py), as it does wrappers/common.sh's, so the deployed wrapper stays one
# file, one compound command parsed whole. Needs run_queue's SLOT, QUEUE, ROOT, idx (the line the
# queue is at), ev, say, now, jstr, pid_alive, transition and halt.
read -ra SVC_NAMES <<<"${ABLATE_SERVICES-}"
ABLATE_PORTS=
declare -A SVC_PID=() SVC_STATE=() SVC_PORT=() SVC_GPU=() SVC_STARTS=() SVC_RC=()
SVC_DIR=$ABLATE_CKPT_ROOT/.ablate-services
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
  while svc_alive "$name" && (( waited++ < ABLATE_SVC_GRACE * 5 )); do sleep 0.2; done
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
svc_fail() {  # svc_fail NAME IDX: the queue stops at line IDX, before its next cell, with the log's tail
  local name=$1 idx=$2 tail_text='' line
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
# shellcheck disable=SC2034  # SVC_FAILED: run_queue reads it when svc_up fails
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
