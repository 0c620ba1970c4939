# shellcheck shell=bash
# ablate's Slurm batch adapter: the tmux verbs a queue's life needs (new-session, new-array,
# list-sessions, kill-session), as Slurm's (sbatch, squeue, scancel). ablate/transport/slurm.py runs
# it with `bash -c` on the login node (or this machine):
#
#   bash -c "$(cat slurm_sessions.sh)" ablate-slurm OUT PREFIX N [SBATCH_OPTION]... VERB [ARG]...
#
# $1 the output dir, $2 the sessions' name prefix (this sweep's on this host), $3 the number of
# sbatch options, then those options, then the verb and its arguments as tmux takes them (and
# `new-array THROTTLE NAME CMD [NAME CMD]...`).
kill_wait=60  # seconds `kill-session` waits for scancel's job to leave squeue (slurm.py reads it)
out=$1 prefix=$2 n=$3; shift 3
opts=("${@:1:$n}"); shift "$n"
me=${USER:-$(id -un)}
# Rows `NAME|ID|...` with an array task's NAME made its queue's session: line K+1 of
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
# Each live job as `SESSION|ID|STATE|NODES|REASON`.
jobs() {
  local rows
  rows=$(squeue -h -r -u "$me" -o '%j|%i|%T|%N|%r') || return
  printf '%s\n' "$rows" | tasks
}
names() { jobs | cut -d'|' -f1; }
okname() {
  case $1 in ''|*[!A-Za-z0-9_+-]*) echo "ablate-slurm: bad job name '$1'" >&2; exit 2 ;; esac
}
verb=$1; shift
case $verb in
  list-sessions)  # each live queue's session and `!job SESSION|ID|STATE|NODES|REASON`, then each
    # node Slurm has out of service: `!node NAME STATE`
    rows=$(jobs) || exit
    printf '%s\n' "$rows" | while IFS='|' read -r name rest; do
      [ -n "$name" ] && printf '%s\n!job %s|%s\n' "$name" "$name" "$rest"
    done
    # Where the cluster keeps accounting: the last job of each of this sweep's sessions that squeue
    # no longer lists (it forgets them after MinJobAge), `!done SESSION|ID|STATE|NODES|EXIT`, a
    # hint for status. Without accounting sacct fails at once, and nothing is printed.
    if acct=$(sacct -X -n -P -u "$me" -S now-14days -o JobName,JobID,State,NodeList,ExitCode \
              2>/dev/null); then
      printf '%s\n' "$acct" | tasks | live=$rows awk -F'|' -v p="$prefix" '
        BEGIN {
          n = split(ENVIRON["live"], l, "\n")
          for (i = 1; i <= n; i++) { split(l[i], f, "|"); up[f[1]] = 1 }
        }
        index($1, p) == 1 && !($1 in up) { last[$1] = $0 }
        END { for (s in last) print "!done " last[s] }'
    fi
    sinfo -h -N -o '%N %T' 2>/dev/null | while read -r node st; do
      case ${st,,} in
        *'*'|down*|drain*|fail*|maint*|unknown*|no_respond*) printf '!node %s %s\n' "$node" "$st" ;;
      esac
    done ;;
  new-session)
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
    live=$(names) || exit
    if printf '%s\n' "$live" | grep -qxF -- "$name"; then
      echo "duplicate session: $name (a Slurm job of that name is pending or running)" >&2
      exit 1
    fi
    mkdir -p -- "$out" || exit
    script="#!/bin/bash
# ablate queue $name
"
    [ -n "$dir" ] && script+="cd $(printf '%q' "$dir") || exit 1
"
    script+="exec $cmd
"
    printf '%s' "$script" | sbatch --parsable --job-name="$name" --output="$out/$name.out" \
          --open-mode=append --chdir="$out" "${opts[@]}"
    ;;
  new-array)  # THROTTLE (0: none) NAME CMD...: the queues not live as job arrays, MaxArraySize
    # tasks each at most; prints `started NAME JOBID` or `duplicate session: NAME` per queue
    throttle=$1; shift
    live=$(names) || exit
    qs=() cs=()
    while [ $# -ge 2 ]; do
      okname "$1"
      if printf '%s\n' "$live" | grep -qxF -- "$1"; then
        echo "duplicate session: $1 (a Slurm job of that name is pending or running)"
      else
        qs+=("$1") cs+=("$2")
      fi
      shift 2
    done
    [ ${#qs[@]} -gt 0 ] || exit 0
    # An array's task ids are below MaxArraySize, and it has at most max_array_tasks tasks.
    conf=$(scontrol show config) || exit
    max=$(printf '%s\n' "$conf" | sed -n 's/^MaxArraySize *= *\([0-9]*\).*/\1/p')
    tasks=$(printf '%s\n' "$conf" | sed -n 's/^SchedulerParameters *=.*max_array_tasks=\([0-9]*\).*/\1/p')
    max=${max:-1001}
    [ -n "$tasks" ] && [ "$tasks" -lt "$max" ] && max=$tasks
    if [ "$max" -lt 1 ]; then
      echo "ablate-slurm: this cluster has job arrays off (MaxArraySize 0): set array: false" >&2
      exit 2
    fi
    total=${#qs[@]} parts=$(( (total + max - 1) / max ))
    if [ "$throttle" -gt 0 ] && [ "$parts" -gt "$throttle" ]; then
      echo "ablate-slurm: $total queues need $parts arrays (MaxArraySize $max) but throttle is" \
           "$throttle: raise throttle to at least $parts" >&2
      exit 2
    fi
    mkdir -p -- "$out" || exit
    for (( p = 0; p < parts; p++ )); do
      first=$(( p * max )) k=$(( total - p * max )); [ "$k" -le "$max" ] || k=$max
      job="${qs[first]}.a$(date +%s%N | tail -c 9)$p"
      script="#!/bin/bash
# ablate queues ${qs[*]:first:k}
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
      if id=$(printf '%s' "$script" | sbatch --parsable --job-name="$job" --array="0-$((k - 1))$t" \
                --output="$out/$job.%a.out" --open-mode=append --chdir="$out" "${opts[@]}"); then
        id=${id%%;*}
        for (( i = 0; i < k; i++ )); do echo "started ${qs[first + i]} ${id}_$i"; done
      else
        rm -f -- "$out/$job.tasks"
        for (( i = 0; i < k; i++ )); do rm -f -- "$out/$job.$i.out"; done
        echo "ablate-slurm: sbatch of array $job failed" >&2
        exit 1
      fi
    done ;;
  kill-session)
    [ "$1" = -t ] && shift
    name=${1#=}
    ids=$(jobs | awk -F'|' -v s="$name" '$1 == s { print $2 }') || exit
    [ -z "$ids" ] || scancel $ids || exit
    i=0
    while names | grep -qxF -- "$name"; do
      i=$((i + 1))
      [ "$i" -le $((kill_wait * 5)) ] || { echo "ablate-slurm: job $name still listed" >&2; exit 1; }
      sleep 0.2
    done ;;
  *) echo "ablate-slurm: unknown verb $verb" >&2; exit 2 ;;
esac
