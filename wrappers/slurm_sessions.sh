# shellcheck shell=bash
# ablate's Slurm batch adapter: the tmux verbs a queue's life needs (new-session, new-array,
# list-sessions, kill-session), as Slurm's (sbatch, squeue, scancel). ablate/transport/slurm.py runs
# it on the login node (or this machine), placed as OUT/.adapter.<sha12>.sh and sourced:
#
#   bash slurm_sessions.sh OUT PREFIX MAXAGE PYTHON ENV N [SBATCH_OPTION]... VERB [ARG]...
#
# $1 the output dir, $2 the sessions' name prefix (this sweep's on this host), $3 how old (s) an
# answer of list-sessions may be (0: ask Slurm now), $4 the profile's python and $5 its env (a shell
# line, or empty), $6 the number of sbatch options, then those options, then the verb and its
# arguments as tmux takes them (and `new-array THROTTLE NAME CMD [NAME CMD]...`; `submit-waiting`,
# the jobs' on-exit hook, run by run_queue as a job ends while queues wait past the submit limit).
#
# This file keeps the processes' life: Slurm's commands, renames, file writes, waits. What to ask,
# what an answer means and what to do next, OUT/.adapter.<sha12>.pyz beside it decides, this
# shell's co-process for the verb (ablate/remote/slurm/adapter_serve.py: the protocol).
out=$1 prefix=$2 maxage=$3 python=$4 penv=$5 n=$6; shift 6
opts=("${@:1:$n}"); shift "$n"
me=${USER:-$(id -un)}
wd=$out/waiting cache=$out/.listing.$prefix busy=$out/.busy
mod=${adapter:-$0} && mod=${mod%.sh}.pyz
# What `decide` answers (the Python's `Verb` says each), and what the verbs share.
need='' arg='' secs=0 fresh=() kind='' why='' next='' entry='' pause='' drop=() back=() listing='' room=0
parts=0 job='' first=0 tasks=() script='' sopts=() puts=() got='' err='' rc=0 id='' mine='' hookf='' hookbody=''
# The co-process: the profile's python (its env activated there alone: sbatch hands this shell's
# environment to the jobs), which answers `:` once it runs.
start() {
  coproc PY {
    if [ -n "$penv" ]; then eval "$penv" </dev/null >&2 || exit 98; fi
    exec "$python" -S "$mod" serve "$out" "$prefix" "${opts[@]}"
  }
  IFS= read -r -d '' got <&"${PY[0]}" && return
  echo "ablate-slurm: $python -S $mod did not start (the profile's python${penv:+ after its env})" >&2
  exit 98
}
# Ask question $1 with words $2...: the answer is shell code, evaluated here: assignments, or the
# verb's end (`exit`; `return RC` when Slurm failed). While it says what it `need`s first, that
# command runs (`fact`) and its answer goes back. Then the files in `puts` (path, line) are written.
decide() {
  local r i
  puts=()
  printf '%s\0' "$#" "$@" >&"${PY[1]}" || return
  while need='' && IFS= read -r -d '' r <&"${PY[0]}" && eval "$r"; do
    if [ -z "$need" ]; then
      for (( i = 0; i + 1 < ${#puts[@]}; i += 2 )); do
        printf '%s\n' "${puts[i+1]}" >"${puts[i]}.$$" && mv -f -- "${puts[i]}.$$" "${puts[i]}"
      done
      return 0
    fi
    fact
    printf '%s\0' 4 fact "$rc" "$got" "$err" >&"${PY[1]}" || break
  done
  echo "ablate-slurm: no answer from $python -S $mod to $1" >&2
  return 1
}
# The Slurm command the Python needs ($need with $arg, at most $secs s; or a sleep between tries):
# its $rc, $got (stdout), $err.
fact() {
  local f o a=()
  f=$(mktemp) || return
  case $need in
    squeue) got=$(timeout "$secs" squeue -h -r -u "$me" --name="$arg" -o '%j|%i|%T|%N|%r|%P' 2>"$f") ;;
    look) got=$(timeout "$secs" squeue -h -u "$me" --name="$arg" -o %i 2>"$f") ;;
    sbatch) while IFS= read -r -d '' o; do a+=("$o"); done <"$arg/opts"
      got=$(timeout "$secs" sbatch --parsable "${a[@]}" <"$arg/job.sh" 2>"$f") ;;
    scancel) read -r -a a <<<"$arg"; got=$(timeout "$secs" scancel "${a[@]}" 2>"$f") ;;
    config) got=$(timeout "$secs" scontrol show config 2>"$f") ;;
    assoc) got=$(timeout "$secs" sacctmgr -n -P show assoc user="$me" ${arg:+cluster="$arg"} \
                   format=Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS,QOS 2>"$f") ;;
    qos) got=$(timeout "$secs" sacctmgr -n -P show qos name="$arg" format=MaxSubmitPU,MaxSubmitPA,GrpSubmit 2>"$f") ;;
    acct) got=$(timeout "$secs" sacct -X -n -P -j "$arg" -o JobID,State,NodeList,ExitCode 2>"$f") ;;
    partition) got=$(timeout "$secs" sinfo -h -o '%P' 2>"$f") ;;
    nodes) got=$(timeout "$secs" sinfo -h -N -p "$arg" -o '%N %T' 2>"$f") ;;
    sleep) got=''; sleep "$arg" ;;
  esac
  rc=$? err=$(cat -- "$f"); rm -f -- "$f"
}
# The jobs' on-exit script (`waiting/.on_exit.<cksum>.sh`, content-addressed): this adapter's
# submit-waiting, there only while a queue waits (run_queue runs it only when it can read it).
hook() {
  hookbody="# ablate: as a job ends, submit this sweep's queues left waiting (wrappers/slurm_sessions.sh)
exec bash -- $(printf '%q ' "${adapter:-$0}" "$out" "$prefix" 0 "$python" "$penv" 0 submit-waiting)"
  hookf=$wd/.on_exit.$(printf '%s' "$hookbody" | cksum | cut -d' ' -f1).sh
}
arm() {
  hook
  [ -r "$hookf" ] || { printf '%s\n' "$hookbody" >"$hookf.$$" && mv -f -- "$hookf.$$" "$hookf"; }
}
# No queue waits: the hooks go; one parked meanwhile arms again (park arms after its rename).
disarm() {
  compgen -G "$wd/*/" >/dev/null && return 0
  rm -f -- "$wd"/.on_exit.*.sh
  if compgen -G "$wd/*/" >/dev/null; then arm; fi
  return 0
}
# A job's waiting entry, not yet visible (`.new.NAME.PID`): job.sh, opts. Prints its path.
entry() {
  local d=$wd/.new.$1.$$ script=$2
  shift 2
  rm -rf -- "$d" && mkdir -p -- "$d" && printf '%s' "$script" >"$d/job.sh" &&
    printf '%s\0' "$@" >"$d/opts" && date +%s >"$d/since" && printf '%s' "$d"
}
single() {  # the entry of session $1 running command $2 in dir $3
  local s
  s="#!/bin/bash
# ablate queue $1
export ABLATE_SLURM_ON_EXIT=$(printf '%q' "$hookf")
"
  [ -n "$3" ] && s+="cd $(printf '%q' "$3") || exit 1
"
  entry "$1" "${s}exec $2
" --job-name="$1" --output="$out/$1.out" --open-mode=append --chdir="$out" "${opts[@]}"
}
submitted() {  # session $1 now has job $2
  printf '%s\n' "$2" >>"$out/$1.jobs"
  rm -f -- "$cache" "$busy"
}
# Leave entry $1 WAITING as session $2 because $3 (fails when the session waits already).
park() {
  printf '%s\n' "$3" >"$1/why"
  mv -T -- "$1" "$wd/$2" 2>/dev/null || { rm -rf -- "$1"; return 1; }
  rm -f -- "$cache"
  arm
}
# Submit waiting queues while the Python finds room, as $1 (status | hook); a hook says which.
take_waiting() {
  local t t0=$SECONDS
  compgen -G "$wd/*/" >/dev/null || { disarm; return 0; }  # nothing waits: nothing to ask
  while decide take "$1" $((SECONDS - t0)) "$mine"; do
    case $next in
      none) disarm; return 0 ;;
      leave) return 0 ;;
      wait) : >"$wd/.hook.$mine"; sleep "$pause"; decide jobs || return 0; continue ;;
    esac
    t=$wd/.taking.$entry.$(hostname).$$
    mv -T -- "$wd/$entry" "$t" 2>/dev/null || continue  # another took it
    touch -- "$t"
    decide submit "$entry" "$t" || return
    if [ -n "$id" ]; then
      rm -rf -- "$t"; submitted "$entry" "$id"
      [ "$1" = status ] || echo "submitted waiting queue $entry as job $id"
      continue
    fi
    printf '%s\n' "$why" >"$t/why"
    [ "$kind" = refused ] && : >"$t/refused"
    mv -T -- "$t" "$wd/$entry" 2>/dev/null && arm || echo "ablate-slurm: could not put $entry back to wait" >&2
    [ "$kind" = transient ] && return 0
  done
}
verb=$1; shift
case $verb in new-session|new-array) mkdir -p -- "$wd" && hook || exit ;; esac
case $verb in
  list-sessions)  # each live or waiting queue's session and `!job` line, `!done` of the ended,
    # `!node` of the nodes out of service (the Python's `Verb.q_listing`)
    if [ "$maxage" -gt 0 ] && [ -r "$cache" ] && t=$(head -n 1 -- "$cache") &&
       [ $(( $(date +%s) - ${t:-0} )) -lt "$maxage" ]; then
      tail -n +2 -- "$cache"; exit 0
    fi
    start
    decide jobs || exit
    if [ -d "$wd" ]; then  # entries whose taker died: dropped when squeue lists their job, else back
      decide recover || exit
      rm -rf -- "${drop[@]}"
      for (( i = 0; i + 1 < ${#back[@]}; i += 2 )); do
        mv -T -- "${back[i]}" "$wd/${back[i+1]}" 2>/dev/null && arm || rm -rf -- "${back[i]}"
      done
      take_waiting status
    fi
    decide listing || exit
    { date +%s; [ -z "$listing" ] || printf '%s\n' "$listing"; } >"$cache.$$" && mv -f -- "$cache.$$" "$cache"
    [ -z "$listing" ] || printf '%s\n' "$listing" ;;
  new-session)  # prints the job id, or `waiting NAME: WHY` when it is left waiting
    name='' dir='' cmd=''
    while [ $# -gt 0 ]; do
      case $1 in
        -d) shift ;;
        -s) name=$2; shift 2 ;;
        -c) dir=$2; shift 2 ;;
        *) cmd=$1; shift ;;
      esac
    done
    start
    decide fresh one "$name" || exit  # a bad name, or one live or waiting, ends it here
    d=$(single "$name" "$cmd" "$dir") || exit
    decide session || exit  # why it waits ("": submit it now)
    if [ -z "$why" ]; then
      decide submit "$name" "$d" || exit
      if [ -n "$id" ]; then rm -rf -- "$d"; submitted "$name" "$id"; printf '%s\n' "$id"; exit 0; fi
      [ "$kind" = refused ] && { rm -rf -- "$d"; echo "$why" >&2; exit 1; }
    fi
    park "$d" "$name" "$why" || { echo "duplicate session: $name (it waits already)" >&2; exit 1; }
    echo "waiting $name: $why" ;;
  new-array)  # THROTTLE (0: none) NAME CMD...: the queues not live as job arrays, as many as the
    # submit limit leaves room for (the rest wait as jobs of their own); prints `started NAME JOBID`
    # (JOBID `waiting` for those) or `duplicate session: NAME`
    throttle=$1; shift
    start
    decide fresh many "$@" || exit  # prints the live ones; `fresh`: the others' indexes
    qs=() cs=()
    for i in "${fresh[@]}"; do qs+=("${@:2*i+1:1}") cs+=("${@:2*i+2:1}"); done
    [ ${#qs[@]} -gt 0 ] || exit 0
    decide array "$throttle" "$hookf" || exit  # the room, and `parts` arrays for it
    for (( i = room; i < ${#qs[@]}; i++ )); do  # the queues past the room wait as jobs of their own
      d=$(single "${qs[i]}" "${cs[i]}" "") && park "$d" "${qs[i]}" "$why" && echo "started ${qs[i]} waiting"
    done
    for (( p = 0; p < parts; p++ )); do
      decide part "$p" || exit  # its job name, first queue, tasks (their sessions), script, sopts
      printf '%s\n' "${tasks[@]}" >"$out/$job.tasks.tmp" || exit
      # Slurm's own output of task i (its messages, a time limit) lands in its queue's log.
      for i in "${!tasks[@]}"; do ln -sfn -- "${tasks[i]}.out" "$out/$job.$i.out" || exit; done
      mv -f -- "$out/$job.tasks.tmp" "$out/$job.tasks" && d=$(entry "$job" "$script" "${sopts[@]}") || exit
      decide submit "$job" "$d" || exit
      if [ -n "$id" ]; then
        rm -rf -- "$d"; rm -f -- "$cache" "$busy"
        for i in "${!tasks[@]}"; do
          printf '%s\n' "${id}_$i" >>"$out/${tasks[i]}.jobs"
          echo "started ${tasks[i]} ${id}_$i"
        done
        continue
      fi
      rm -rf -- "$d" "$out/$job.tasks"
      for i in "${!tasks[@]}"; do rm -f -- "$out/$job.$i.out"; done
      [ "$kind" = refused ] && { echo "ablate-slurm: sbatch of array $job failed: $why" >&2; exit 1; }
      for i in "${!tasks[@]}"; do
        d=$(single "${tasks[i]}" "${cs[first + i]}" "") && park "$d" "${tasks[i]}" "$why" &&
          echo "started ${tasks[i]} waiting"
      done
    done ;;
  submit-waiting)  # the jobs' on-exit hook: take waiting queues while there is room
    compgen -G "$wd/*/" >/dev/null || { disarm; exit 0; }  # nothing waits: Slurm is not asked
    start
    decide jobs || exit
    mine=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}} && mine=${mine:-${SLURM_JOB_ID:-}}
    trap 'rm -f -- "$wd/.hook.${mine:-none}"' EXIT
    take_waiting hook ;;
  kill-session)  # scancel of the session's jobs, then a wait until squeue no longer lists them
    [ "$1" = -t ] && shift
    name=${1#=}
    # A waiting queue: its entry goes (renamed first: no hook submits it meanwhile).
    if mv -T -- "$wd/$name" "$wd/.gone.$name.$$" 2>/dev/null; then
      rm -rf -- "$wd/.gone.$name.$$" "$cache"; disarm
    fi
    start
    decide kill "$name" || exit  # ends here when none is listed
    rm -f -- "$cache"; t0=$SECONDS
    while decide gone "$name" $((SECONDS - t0)) && [ -n "$pause" ]; do sleep "$pause"; done ;;
  *) echo "ablate-slurm: unknown verb $verb" >&2; exit 2 ;;
esac
