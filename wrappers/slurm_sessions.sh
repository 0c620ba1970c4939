# shellcheck shell=bash
# ablate's Slurm batch adapter: the tmux verbs a queue's life needs (new-session, new-array,
# list-sessions, kill-session), as Slurm's (sbatch, squeue, scancel). ablate/transport/slurm.py runs
# it on the login node (or this machine), placed as OUT/.adapter.<sha12>.sh and sourced:
#
#   bash slurm_sessions.sh OUT PREFIX MAXAGE N [SBATCH_OPTION]... VERB [ARG]...
#
# $1 the output dir, $2 the sessions' name prefix (this sweep's on this host), $3 how old (s) an
# answer of list-sessions may be (0: ask Slurm now), $4 the number of sbatch options, then those
# options, then the verb and its arguments as tmux takes them (and `new-array THROTTLE NAME CMD
# [NAME CMD]...`; `submit-waiting`, the jobs' on-exit hook).
#
# Slurm is asked politely: one squeue per verb, filtered to this user and this sweep's job names
# (those with a record in OUT); sacct only for the recorded last job of a session squeue no longer
# lists (`-j` those ids, once: a job's end is kept in `<session>.done`); sinfo only for the sweep's
# partitions.
#
# Submit limits: at most the cluster's MaxSubmitJobs (sacctmgr, else learned from sbatch's refusal)
# of this sweep's jobs are in Slurm; a queue past it is left WAITING, `OUT/waiting/<session>/`
# holding its exact job script (job.sh) and sbatch options (opts, NUL-separated), and its refusal
# in Slurm's words (why). Each job's script exports ABLATE_SLURM_ON_EXIT (run_queue runs it as the
# job ends, when it is there: only while a queue waits): this adapter with the verb `submit-waiting`, which takes each waiting queue by renaming
# its directory (exactly one taker), submits it, and puts it back when sbatch refuses. Slurm counts
# a job until its last process ends, the hook included, so the controller's submits keep one place
# free for it. list-sessions (status, launch) submits waiting queues too.
kill_wait=60  # seconds `kill-session` waits for scancel's job to leave squeue (slurm.py reads it)
sbatch_timeout=20  # seconds one sbatch may take (a timed-out one may have submitted: squeue tells)
limits_age=600  # seconds a known submit limit is trusted before sacctmgr is asked again
out=$1 prefix=$2 maxage=$3 n=$4; shift 4
opts=("${@:1:$n}"); shift "$n"
me=${USER:-$(id -un)}
wd=$out/waiting
cache=$out/.listing.$prefix
limits=$out/.limits.$prefix
busy=$out/.busy
# The rows `NAME|ID|...` with an array task's NAME made its queue's session: line K+1 of
# `<out>/<array job name>.tasks` (written before its sbatch) for an ID `J_K` of a job name
# holding `.a` (no session name does).
tasks() {
  awk -F'|' -v OFS='|' -v out="$out" '
    $1 == "" { next }
    index($1, ".a") && $2 ~ /_[0-9]+$/ {
      t = $2; sub(/.*_/, "", t)
      f = out "/" $1 ".tasks"
      if (!(f in seen)) { seen[f] = 1; k = 0; while ((getline l < f) > 0) map[f, k++] = l; close(f) }
      if ((f, t) in map) $1 = map[f, t]
    }
    { print }'
}
# This sweep's job names in OUT (all hosts'): a session's `.jobs` or `.out`, an array's `.tasks`.
sweep_names() {
  local f b
  local -A seen=()
  for f in "$out"/*.jobs "$out"/*.tasks "$out"/*.out; do
    [ -e "$f" ] || continue
    b=${f##*/} b=${b%.*}
    case $b in *.a*.*|'') continue ;; esac  # an array task's output link: its .tasks names it
    seen[$b]=1
  done
  local IFS=,
  printf '%s' "${!seen[*]}"
}
# Each live job of this sweep as `SESSION|ID|STATE|NODES|REASON|PARTITION`: one squeue.
jobs() {
  local list rows
  list=$(sweep_names)
  [ -n "$list" ] || return 0
  rows=$(loud=1 call 30 squeue -h -r -u "$me" --name="$list" -o '%j|%i|%T|%N|%r|%P') || return
  printf '%s\n' "$rows" | tasks
}
count() { [ -z "$1" ] && echo 0 || printf '%s\n' "$1" | grep -c .; }
transient() {
  case $1 in
    *'Socket timed out'*|*'Resource temporarily unavailable'*|*'Unable to contact slurm controller'*|\
    *[Bb]usy*|*'Connection refused'*|*'Zero Bytes were transmitted'*|*'try again'*) return 0 ;;
  esac
  return 1
}
# `call SECS CMD...`: its stdout, its stderr in $err (and on stderr when `loud` is set and it
# failed: a caller in a subshell does not see $err); a transient error retried (1 s, 2 s).
call() {
  local secs=$1 try o rc f
  shift
  f=$(mktemp) || return
  for try in 1 2 3; do
    o=$(timeout "$secs" "$@" 2>"$f"); rc=$?
    err=$(tr '\n|' ' /' <"$f")
    [ "$rc" -ne 0 ] && [ "$try" -lt 3 ] && { transient "$err" || [ "$rc" = 124 ]; } || break
    sleep "$try"
  done
  rm -f -- "$f"
  [ -z "$o" ] || printf '%s\n' "$o"
  [ "$rc" = 0 ] || [ -z "${loud-}" ] || printf '%s: %s\n' "$1" "${err:-exit $rc}" >&2
  return "$rc"
}
okname() {
  case $1 in ''|*[!A-Za-z0-9_+-]*) echo "ablate-slurm: bad job name '$1'" >&2; exit 2 ;; esac
}
# This sweep's submit limit here (empty: none known), from the cache, else sacctmgr (the least of
# the user's association's MaxSubmitJobs/GrpSubmitJobs and the QOS's MaxSubmitJobsPerUser/
# -PerAccount/GrpSubmitJobs) where Slurm enforces limits; src says where it came from.
limit() {
  local now t v s conf enforce cluster acct qos row a p ms gs q dq o parts=
  now=$(date +%s)
  if [ -r "$limits" ] && read -r t v s <"$limits" && [ $((now - t)) -lt "$limits_age" ]; then
    src=$s lim=${v#-}; return
  fi
  lim='' src=none
  if conf=$(timeout 20 scontrol show config 2>/dev/null); then
    enforce=$(printf '%s\n' "$conf" | sed -n 's/^AccountingStorageEnforce *= *//p')
    cluster=$(printf '%s\n' "$conf" | sed -n 's/^ClusterName *= *//p')
    case $enforce in *limits*|*safe*) ;; *) src=not-enforced; remember; return ;; esac
  fi
  for o in "${opts[@]}"; do
    case $o in --account=*) acct=${o#*=} ;; --qos=*) qos=${o#*=} ;; --partition=*) parts=${o#*=} ;; esac
  done
  if ! row=$(timeout 20 sacctmgr -n -P show assoc user="$me" ${cluster:+cluster="$cluster"} \
               format=Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS,QOS 2>/dev/null); then
    remember; return
  fi
  while IFS='|' read -r a p ms gs dq q; do
    [ -n "$a" ] || continue
    [ -z "${acct-}" ] || [ "$a" = "$acct" ] || continue
    [ -z "$p" ] || [ -z "$parts" ] || [[ ,$parts, == *,"$p",* ]] || continue
    for v in $ms $gs; do least "$v" sacctmgr-assoc; done
    [ -n "${qos-}" ] || qos=${dq:-${q%%,*}}
  done <<<"$row"
  if [ -n "${qos-}" ] && row=$(timeout 20 sacctmgr -n -P show qos name="$qos" \
                                 format=MaxSubmitPU,MaxSubmitPA,GrpSubmit 2>/dev/null); then
    IFS='|' read -r ms gs q <<<"$row"
    for v in $ms $gs $q; do least "$v" "sacctmgr-qos-$qos"; done
  fi
  remember
}
least() { case $1 in ''|*[!0-9]*) return ;; esac; [ -n "$lim" ] && [ "$lim" -le "$1" ] || lim=$1 src=$2; }
remember() { printf '%s %s %s\n' "$(date +%s)" "${lim:--}" "$src" >"$limits.$$" && mv -f -- "$limits.$$" "$limits"; }
# A refusal for a limit at $1 of this sweep's jobs: that is the limit (trusted half as long).
learn() {
  lim=$(($1 > 0 ? $1 : 1)) src=learned  # at 0 of ours, the user's other jobs fill it: try one
  printf '%s %s %s\n' "$(( $(date +%s) - limits_age / 2 ))" "$lim" "$src" >"$limits.$$" &&
    mv -f -- "$limits.$$" "$limits"
}
# The submits of the controller leave one place for a finishing job's hook (module doc).
reserve() { [ -n "$lim" ] && [ "$lim" -ge 2 ] && echo 1 || echo 0; }
# The on-exit script of this sweep's jobs (`waiting/.on_exit.<cksum>.sh`, content-addressed: the
# same path always holds the same text): this adapter, taking waiting queues. It is there only
# while a queue waits (`arm`, `disarm`): run_queue runs it only when it can read it, so a job's end
# costs nothing (not even a bash) while nothing waits. Sets $hookf (its path) and $hookbody.
hook() {
  hookbody="# ablate: as a job ends, submit this sweep's queues left waiting (wrappers/slurm_sessions.sh)
exec bash -- $(printf '%q ' "${adapter:-$0}" "$out" "$prefix" 0 0 submit-waiting)"
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
  local name=$1 script=$2 d=$wd/.new.$1.$$
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
# Submit entry $2 (job name $1): 0 and $id, else 1 and $kind (limit | transient | refused), $why.
# A transient error is tried again after 2 and 4 s while the first try began less than
# sbatch_timeout s ago; a time-out is not (slurmctld does not answer: the queue waits).
submit() {
  local name=$1 d=$2 o try rc t0=$SECONDS
  local -a so=()
  while IFS= read -r -d '' o; do so+=("$o"); done <"$d/opts"
  for try in 1 2 3; do
    id=$(timeout "$sbatch_timeout" sbatch --parsable "${so[@]}" <"$d/job.sh" 2>"$d/err"); rc=$?
    why=$(grep -v '^$' "$d/err" | tr '\n|' ' /'); why=${why% }
    if [ "$rc" = 0 ]; then id=${id%%;*}; return 0; fi
    [ "$rc" = 124 ] && why="sbatch did not answer within ${sbatch_timeout}s"
    [ "$rc" = 127 ] && { kind=transient; return 1; }  # no sbatch here (a node without the client)
    case $why in
      *SubmitJob*|*'submit limit'*) kind=limit; return 1 ;;
    esac
    if [ "$rc" = 124 ] || transient "$why"; then
      kind=transient
      # A timed-out sbatch may have submitted it: never twice.
      id=$(timeout 10 squeue -h -u "$me" --name="$name" -o %i 2>/dev/null | head -n 1)
      [ -n "$id" ] && return 0
      # Another try only within the submit's budget: a launch's submits share one command's time.
      [ "$rc" != 124 ] && [ "$try" -lt 3 ] && [ $((SECONDS - t0)) -lt "$sbatch_timeout" ] || return 1
      sleep $((try * 2))
      continue
    fi
    kind=refused; return 1
  done
  return 1
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
# Submit waiting queues, oldest name first, while this sweep has fewer than its limit (minus the
# reserve when $1 is 1) jobs in Slurm ($live now); wait for a place up to $2 s while it took none.
# Prints `NAME|ID` of each it submitted.
take_waiting() {
  local res=0 patience=$2 start=$SECONDS pause=2 d name t rows took=
  local -A tried=()
  compgen -G "$wd/*/" >/dev/null || { disarm; return 0; }  # nothing waits: nothing to ask
  limit
  [ "$1" = 1 ] && res=$(reserve)
  while :; do
    d=''
    for t in "$wd"/*/; do
      t=${t%/}; name=${t##*/}
      [ -d "$t" ] && [ -z "${tried[$name]-}" ] && [ ! -e "$t/refused" ] && { d=$t; break; }
    done
    [ -n "$d" ] || { disarm; return 0; }
    if [ -n "$lim" ] && [ "$live" -ge $((lim - res)) ]; then
      # Once it took one, a hook leaves: its own end frees the place the next hook takes.
      [ -z "$took" ] && [ $((SECONDS - start + pause)) -le "$patience" ] && hold_on "$rows" || return 0
      sleep "$pause"; pause=$((pause * 2 > 16 ? 16 : pause * 2))
      rows=$(jobs) || return 0
      live=$(count "$rows")
      continue
    fi
    tried[$name]=1
    t=$wd/.taking.$name.$(hostname).$$
    mv -T -- "$d" "$t" 2>/dev/null || continue  # another took it
    touch -- "$t"
    if submit "$name" "$t"; then
      rm -rf -- "$t"; submitted "$name" "$id"; live=$((live + 1)) took=1
      printf '%s|%s\n' "$name" "$id"
      continue
    fi
    printf '%s\n' "$why" >"$t/why"
    [ "$kind" = refused ] && : >"$t/refused"
    mv -T -- "$t" "$d" 2>/dev/null && arm || echo "ablate-slurm: could not put $name back to wait" >&2
    case $kind in
      limit) learn "$live" ;;
      transient) printf '%s %s\n' "$(date +%s)" "$why" >"$busy"; return 0 ;;
    esac
  done
}
# Whether a hook with no place should wait for one: only while another job of the sweep may end
# and free one. A waiting hook holds its job's place (marked `.hook.<job id>`): when every other
# job is a waiting hook too, the one of the highest id leaves (its end is the others' place), and
# with no other job at all, it leaves (the next status or launch submits what still waits).
hold_on() {
  local mine=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}} id others=0 hooks=0 top=''
  mine=${mine:-${SLURM_JOB_ID:-}}
  [ -n "$mine" ] || return 1
  : >"$wd/.hook.$mine"
  for id in $(printf '%s\n' "$1" | cut -d'|' -f2); do
    [ "$id" = "$mine" ] && continue
    others=$((others + 1))
    [ -e "$wd/.hook.$id" ] || continue
    hooks=$((hooks + 1))
    { [ -z "$top" ] || above "$id" "$top"; } && top=$id
  done
  [ "$others" -gt 0 ] || return 1
  [ "$hooks" -lt "$others" ] && return 0
  ! above "$mine" "$top"
}
above() {  # job id $1 (`J` or `A_i`) is above $2
  local a=${1%%_*} b=${2%%_*}
  [ "$a" -ne "$b" ] && { [ "$a" -gt "$b" ]; return; }
  [ "${1#*_}" != "$1" ] && [ "${2#*_}" != "$2" ] && [ "${1#*_}" -gt "${2#*_}" ]
}
# An entry whose taker died (older than 5 min): its job if squeue lists one, else back to wait.
recover() {
  local t name
  for t in "$wd"/.taking.*; do
    [ -d "$t" ] && [ -n "$(find "$t" -maxdepth 0 -mmin +5)" ] || continue
    name=${t##*/.taking.} name=${name%%.*}
    if printf '%s\n' "$1" | cut -d'|' -f1 | grep -qxF -- "$name"; then rm -rf -- "$t"
    else mv -T -- "$t" "$wd/$name" 2>/dev/null && arm || rm -rf -- "$t"; fi
  done
  find "$wd" -maxdepth 1 \( -name '.new.*' -o -name '.hook.*' \) -mmin +5 -exec rm -rf -- {} + 2>/dev/null
  return 0
}
busy_now() {  # slurmctld failed a submit within the last minute: $why
  local t w
  [ -r "$busy" ] && read -r t w <"$busy" && [ $(( $(date +%s) - t )) -lt 60 ] && why=$w
}
live_name() { printf '%s\n' "$1" | cut -d'|' -f1 | grep -qxF -- "$2" || [ -e "$wd/$2" ]; }
terminal() {
  case ${1%% *} in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
    return 0 ;; esac
  return 1
}
# `!done` of each of this prefix's sessions whose recorded last job squeue no longer lists:
# its `.done`, else one sacct of exactly those ids (not while sacct failed within 5 min).
ended() {
  local f s id line got t
  local -a ask=()
  local -A who=()
  for f in "$out/$prefix"*.jobs; do
    [ -r "$f" ] || continue
    s=${f##*/} s=${s%.jobs}
    live_name "$1" "$s" && continue
    id=$(tail -n 1 -- "$f")
    [ -n "$id" ] || continue
    if [ -r "$out/$s.done" ] && read -r line <"$out/$s.done" && [ "${line#*|}" != "$line" ] &&
       [ "$(printf '%s' "$line" | cut -d'|' -f2)" = "$id" ]; then
      printf '!done %s\n' "$line"; continue
    fi
    ask+=("$id") who[$id]=$s
  done
  [ ${#ask[@]} -gt 0 ] || return 0
  if [ -r "$out/.noacct" ] && read -r t <"$out/.noacct" && [ $(( $(date +%s) - t )) -lt 300 ]; then return 0; fi
  if ! got=$(call 30 sacct -X -n -P -j "$(IFS=,; echo "${ask[*]}")" -o JobID,State,NodeList,ExitCode); then
    date +%s >"$out/.noacct"; return 0
  fi
  printf '%s\n' "$got" | while IFS='|' read -r id t s f; do
    [ -n "$id" ] && [ -n "${who[$id]-}" ] || continue
    line="${who[$id]}|$id|$t|$s|$f"
    printf '!done %s\n' "$line"
    terminal "$t" && printf '%s\n' "$line" >"$out/${who[$id]}.done"
  done
}
verb=$1; shift
hookf='' hookbody=''
case $verb in new-session|new-array) mkdir -p -- "$wd" && hook || exit ;; esac
case $verb in
  list-sessions)  # each live queue's session and `!job SESSION|ID|STATE|NODES|REASON` (a waiting
    # queue: ID -, STATE WAITING or REFUSED, REASON why), then `!done` lines (sacct), then each
    # node of the sweep's partitions Slurm has out of service: `!node NAME STATE`
    if [ "$maxage" -gt 0 ] && [ -r "$cache" ] && t=$(head -n 1 -- "$cache") &&
       [ $(( $(date +%s) - ${t:-0} )) -lt "$maxage" ]; then
      tail -n +2 -- "$cache"; exit 0
    fi
    rows=$(jobs) || exit
    live=$(count "$rows")
    if [ -d "$wd" ]; then
      recover "$rows"
      lim=''
      busy_now || new=$(take_waiting 1 0)
      [ -z "${new-}" ] || rows+=$'\n'$(printf '%s\n' "$new" | sed 's/$/|PENDING||None|/')
    fi
    # The sweep's partitions: the profile's, else the cluster's default (where its jobs go), asked
    # once and kept in `.partition`.
    parts=
    for o in "${opts[@]}"; do case $o in --partition=*) parts=${o#*=} ;; esac; done
    if [ -z "$parts" ] && { [ -s "$out/.partition" ] || { p=$(call 30 sinfo -h -o '%P' | sed -n 's/\*$//p') &&
         [ -n "$p" ] && printf '%s\n' "$p" >"$out/.partition"; }; }; then
      parts=$(head -n 1 -- "$out/.partition")
    fi
    {
      printf '%s\n' "$rows" | while IFS='|' read -r name id st nodes why _; do
        [ -n "$name" ] && printf '%s\n!job %s|%s|%s|%s|%s\n' "$name" "$name" "$id" "$st" "$nodes" "$why"
      done
      for d in "$wd"/*/; do
        d=${d%/}; [ -d "$d" ] || continue
        st=WAITING; [ -e "$d/refused" ] && st=REFUSED
        why=$(head -c 400 -- "$d/why" 2>/dev/null | tr '\n|' ' /')
        printf '%s\n!job %s|-|%s||%s\n' "${d##*/}" "${d##*/}" "$st" "${why:-submit limit}"
      done
      ended "$rows"
      if [ -n "$parts" ]; then
        call 30 sinfo -h -N -p "$parts" -o '%N %T' | while read -r node st; do
          case ${st,,} in
            *'*'|down*|drain*|fail*|maint*|unknown*|no_respond*) printf '!node %s %s\n' "$node" "$st" ;;
          esac
        done
      fi
    } >"$cache.$$"
    { date +%s; cat -- "$cache.$$"; } >"$cache.$$.t" && mv -f -- "$cache.$$.t" "$cache"
    cat -- "$cache.$$"; rm -f -- "$cache.$$" ;;
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
    okname "$name"
    rows=$(jobs) || exit
    if live_name "$rows" "$name"; then
      echo "duplicate session: $name (a Slurm job of that name is pending or running, or waits)" >&2
      exit 1
    fi
    d=$(single "$name" "$cmd" "$dir") || exit
    live=$(count "$rows")
    limit
    why=''
    if busy_now; then why="slurmctld did not take a job a moment ago: $why"
    elif [ -n "$lim" ] && [ "$live" -ge $((lim - $(reserve))) ]; then
      why="submit limit $lim ($src): $live of this sweep's jobs are in Slurm; submitted as one ends"
    elif submit "$name" "$d"; then
      rm -rf -- "$d"; submitted "$name" "$id"; printf '%s\n' "$id"; exit 0
    else
      case $kind in
        limit) learn "$live" ;;
        transient) printf '%s %s\n' "$(date +%s)" "$why" >"$busy" ;;
        *) rm -rf -- "$d"; echo "$why" >&2; exit 1 ;;
      esac
    fi
    park "$d" "$name" "$why" || { echo "duplicate session: $name (it waits already)" >&2; exit 1; }
    echo "waiting $name: $why" ;;
  new-array)  # THROTTLE (0: none) NAME CMD...: the queues not live as job arrays, MaxArraySize
    # tasks each at most, as many as the submit limit leaves room for (the rest wait as jobs of
    # their own); prints `started NAME JOBID` (JOBID `waiting` for those) or `duplicate session: NAME`
    throttle=$1; shift
    rows=$(jobs) || exit
    qs=() cs=()
    while [ $# -ge 2 ]; do
      okname "$1"
      if live_name "$rows" "$1"; then
        echo "duplicate session: $1 (a Slurm job of that name is pending or running, or waits)"
      else
        qs+=("$1") cs+=("$2")
      fi
      shift 2
    done
    [ ${#qs[@]} -gt 0 ] || exit 0
    # An array's task ids are below MaxArraySize, and it has at most max_array_tasks tasks.
    conf=$(loud=1 call 30 scontrol show config) || exit 1
    max=$(printf '%s\n' "$conf" | sed -n 's/^MaxArraySize *= *\([0-9]*\).*/\1/p')
    tasks=$(printf '%s\n' "$conf" | sed -n 's/^SchedulerParameters *=.*max_array_tasks=\([0-9]*\).*/\1/p')
    max=${max:-1001}
    [ -n "$tasks" ] && [ "$tasks" -lt "$max" ] && max=$tasks
    if [ "$max" -lt 1 ]; then
      echo "ablate-slurm: this cluster has job arrays off (MaxArraySize 0): set array: false" >&2
      exit 2
    fi
    live=$(count "$rows")
    limit
    total=${#qs[@]} room=${#qs[@]} why=''
    if busy_now; then room=0 why="slurmctld did not take a job a moment ago: $why"
    elif [ -n "$lim" ]; then
      room=$((lim - $(reserve) - live)); [ "$room" -gt 0 ] || room=0
      [ "$room" -ge "$total" ] || why="submit limit $lim ($src): this sweep's jobs in Slurm would be more"
      [ "$room" -le "$total" ] || room=$total
    fi
    parts=$(( (room + max - 1) / max ))
    if [ "$throttle" -gt 0 ] && [ "$parts" -gt "$throttle" ]; then
      echo "ablate-slurm: $total queues need $parts arrays (MaxArraySize $max) but throttle is" \
           "$throttle: raise throttle to at least $parts" >&2
      exit 2
    fi
    # The queues past the room wait as jobs of their own.
    for (( i = room; i < total; i++ )); do
      d=$(single "${qs[i]}" "${cs[i]}" "") && park "$d" "${qs[i]}" "$why" && echo "started ${qs[i]} waiting"
    done
    for (( p = 0; p < parts; p++ )); do
      first=$(( p * max )) k=$(( room - p * max )); [ "$k" -le "$max" ] || k=$max
      job="${qs[first]}.a$(date +%s%N | tail -c 9)$p"
      script="#!/bin/bash
# ablate queues ${qs[*]:first:k}
export ABLATE_SLURM_ON_EXIT=$(printf '%q' "$hookf")
case \${SLURM_ARRAY_TASK_ID:-} in
"
      : >"$out/$job.tasks.tmp" || exit
      for (( i = 0; i < k; i++ )); do
        q=${qs[first + i]}
        printf '%s\n' "$q" >>"$out/$job.tasks.tmp"
        # Slurm's own output for task i (its messages, a time limit) lands in the queue's log.
        ln -sfn -- "$q.out" "$out/$job.$i.out" || exit
        script+="$i) exec ${cs[first + i]} ;;
"
      done
      script+="esac
echo \"ablate: no queue for array task \${SLURM_ARRAY_TASK_ID:-}\" >&2; exit 2
"
      mv -f -- "$out/$job.tasks.tmp" "$out/$job.tasks" || exit
      # This part's share of the throttle: the parts together never run more than it.
      t=
      [ "$throttle" -gt 0 ] && t=%$(( throttle / parts ))
      d=$(entry "$job" "$script" --job-name="$job" --array="0-$((k - 1))$t" \
            --output="$out/$job.%a.out" --open-mode=append --chdir="$out" "${opts[@]}") || exit
      if submit "$job" "$d"; then
        rm -rf -- "$d"; rm -f -- "$cache" "$busy"
        for (( i = 0; i < k; i++ )); do
          printf '%s\n' "${id}_$i" >>"$out/${qs[first + i]}.jobs"
          echo "started ${qs[first + i]} ${id}_$i"
        done
        continue
      fi
      rm -rf -- "$d" "$out/$job.tasks"
      for (( i = 0; i < k; i++ )); do rm -f -- "$out/$job.$i.out"; done
      if [ "$kind" = refused ]; then
        echo "ablate-slurm: sbatch of array $job failed: $why" >&2
        exit 1
      fi
      [ "$kind" = limit ] && learn "$live"
      [ "$kind" = transient ] && printf '%s %s\n' "$(date +%s)" "$why" >"$busy"
      for (( i = 0; i < k; i++ )); do
        d=$(single "${qs[first + i]}" "${cs[first + i]}" "") && park "$d" "${qs[first + i]}" "$why" &&
          echo "started ${qs[first + i]} waiting"
      done
    done ;;
  submit-waiting)  # the jobs' on-exit hook: take waiting queues while there is room, waiting for
    # one up to 90 s (this job still counts until it ends)
    compgen -G "$wd/*/" >/dev/null || { disarm; exit 0; }  # nothing waits: Slurm is not asked
    rows=$(jobs) || exit
    live=$(count "$rows")
    myjob=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
    myjob=${myjob:-${SLURM_JOB_ID:-none}}
    trap 'rm -f -- "$wd/.hook.$myjob"' EXIT
    take_waiting 0 90 | sed 's/^\(.*\)|\(.*\)$/submitted waiting queue \1 as job \2/' ;;
  kill-session)
    [ "$1" = -t ] && shift
    name=${1#=}
    # A waiting queue: its entry goes (renamed first: no hook submits it meanwhile).
    if mv -T -- "$wd/$name" "$wd/.gone.$name.$$" 2>/dev/null; then
      rm -rf -- "$wd/.gone.$name.$$" "$cache"; disarm
    fi
    rows=$(jobs) || exit
    ids=$(printf '%s\n' "$rows" | awk -F'|' -v s="$name" '$1 == s { print $2 }')
    [ -z "$ids" ] && exit 0
    # shellcheck disable=SC2086  # the ids, one word each
    loud=1 call 30 scancel $ids >/dev/null || exit 1
    rm -f -- "$cache"
    start=$SECONDS pause=0.2
    while rows=$(jobs) && printf '%s\n' "$rows" | cut -d'|' -f1 | grep -qxF -- "$name"; do
      [ $((SECONDS - start)) -le "$kill_wait" ] || { echo "ablate-slurm: job $name still listed" >&2; exit 1; }
      sleep "$pause"
      case $pause in 0.2) pause=0.5 ;; 0.5) pause=1 ;; *) pause=2 ;; esac
    done ;;
  *) echo "ablate-slurm: unknown verb $verb" >&2; exit 2 ;;
esac
