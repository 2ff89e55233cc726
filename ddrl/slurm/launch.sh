# Shared launch logic of ddrl's batch scripts: sourced by train.sbatch, array.sbatch, dgx.sbatch
# and central.sbatch, and inlined by `ddrl slurm` so that a printed script stands alone.
#
#   ddrl_main JOB.toml [--out DIR] [--set key=value ...] [--sweep FILE]
#
# Which run directory, seed or sweep line a task gets is decided by `ddrl slurm --resolve`
# (Python, unit-tested); this file only does what must happen in the batch shell: launch the
# MPI step, pass Slurm's warning signal on to it and requeue the job when it stopped resumably.
#
# Environment: DDRL_JOB, DDRL_OUT (instead of the arguments), DDRL_VENV (the environment with
# `ddrl`), DDRL_LAUNCHER (srun | mpirun), DDRL_SRUN_ARGS, DDRL_MPIRUN_ARGS (binding flags),
# DDRL_MAX_RESTARTS (restarts after a lost rank or node within one job, default 3).

# `ddrl train` exits with this code after a signal made it checkpoint: the run can go on.
DDRL_EXIT_RESUMABLE=3
# Exit codes that a restart cannot mend: bad input or a full disk (2), a diverged run (5).
# Others restart from the last checkpoint: a lost rank (4), a storage fault that may pass (7).
DDRL_EXIT_FINAL="2 5"

# Each rank keeps one GPU: the one at its local rank in the list Slurm granted the node
# (a list of one under --gpus-per-task). mpirun's ranks share one SLURM_LOCALID, so Open
# MPI's local rank comes first. USR1 is ignored until `ddrl train` takes it as a stop
# request (an ignored signal stays ignored across exec): one that arrives while the rank
# starts would kill it; ddrl_wait_step repeats it until the step ends.
# shellcheck disable=SC2016
DDRL_RANK_SH='
trap "" USR1
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -ra gpus <<< "$CUDA_VISIBLE_DEVICES"
  local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}
  export CUDA_VISIBLE_DEVICES=${gpus[local_rank % ${#gpus[@]}]}
fi
exec "$@"'

ddrl_die() {
  echo "ddrl: error: $*" >&2
  exit 2
}

# Sets `ddrl`: DDRL_VENV's, else the one in the .venv of the checkout these scripts came from
# or of the submit directory, else the one on PATH.
ddrl_find() {
  if [ -n "${DDRL_VENV:-}" ]; then
    ddrl=$DDRL_VENV/bin/ddrl
    [ -x "$ddrl" ] || ddrl_die "DDRL_VENV=$DDRL_VENV has no bin/ddrl"
    return
  fi
  for ddrl in ${DDRL_SLURM_DIR:+"$(dirname "$DDRL_SLURM_DIR")/.venv/bin/ddrl"} \
              "${SLURM_SUBMIT_DIR:-.}/.venv/bin/ddrl"; do
    [ -x "$ddrl" ] && return
  done
  ddrl=$(command -v ddrl) || ddrl_die "ddrl not found: set DDRL_VENV or put ddrl on PATH"
}

# Sets `launcher`, the command that starts the job step: one ddrl rank per Slurm task.
ddrl_launcher() {
  local -a flags
  case ${DDRL_LAUNCHER:-srun} in
    srun)
      # Slurm 22.05's srun ignores the job's --cpus-per-task unless told again; -K1 ends the
      # step when one rank fails instead of leaving the others blocked in a collective.
      read -ra flags <<< "${DDRL_SRUN_ARGS---cpu-bind=cores}"
      launcher=(srun --mpi=pmix -K1 ${SLURM_CPUS_PER_TASK:+"--cpus-per-task=$SLURM_CPUS_PER_TASK"} "${flags[@]}") ;;
    mpirun)
      [ "${SLURM_HET_SIZE:-1}" -eq 1 ] || ddrl_die "a heterogeneous job (central mode) needs DDRL_LAUNCHER=srun"
      read -ra flags <<< "${DDRL_MPIRUN_ARGS---bind-to core --map-by slot:PE=${SLURM_CPUS_PER_TASK:-1}}"
      [ "$(id -u)" != 0 ] || flags+=(--allow-run-as-root)
      # On a cancel mpirun gets Slurm's TERM too and kills the ranks, by default 1 s after
      # passing them the TERM: too soon for a rank to reach its update's end and checkpoint.
      flags+=(-x DDRL_EXIT_FILE --mca odls_base_sigkill_timeout 10)
      launcher=(mpirun "${flags[@]}") ;;
    *) ddrl_die "DDRL_LAUNCHER=$DDRL_LAUNCHER: expected srun or mpirun" ;;
  esac
  ddrl_shrink
}

# Sets `step`: the launcher running COMMAND... as every task of the job. In a heterogeneous
# job (central mode: the learner component, then the actors) one srun spans the components,
# each with its own cores, and MPI (PMIx) gives them one world, the learner's task rank 0.
ddrl_step() {
  local g cpus
  local -a flags
  if [ "${SLURM_HET_SIZE:-1}" -eq 1 ]; then
    step=("${launcher[@]}" "$@")
    return
  fi
  read -ra flags <<< "${DDRL_SRUN_ARGS---cpu-bind=cores}"
  step=(srun --mpi=pmix -K1)
  for ((g = 0; g < SLURM_HET_SIZE; g++)); do
    cpus=SLURM_CPUS_PER_TASK_HET_GROUP_$g
    [ "$g" -eq 0 ] || step+=(:)
    step+=(--het-group="$g" ${!cpus:+"--cpus-per-task=${!cpus}"} "${flags[@]}" "$@")
  done
}

# Waits for the step (step_pid) and returns its exit status. A launcher ends within seconds
# of its tasks, or within KillWait once it kills the rest after one failed. One still there
# DDRL_STEP_GRACE seconds (default 60) after rank 0 of `ddrl train` exited (it writes its
# exit code to DDRL_EXIT_FILE, on the batch host where rank 0 runs) waits on something no
# rank will end, such as a process that left a rank's process tree, so the step's kill
# missed it, and holds the step's output open. That launcher is ended and the step's status
# is rank 0's (rank 0 checkpoints), so the job restarts or requeues instead of sitting out
# its time limit. A stop asked for is repeated every 5 s: ranks that were still starting
# when it came ignored it (DDRL_RANK_SH); a rank that has it already takes it once.
# After a cancel, Slurm kills whatever is left of the job, this script too, KillWait seconds
# (30 by default) after its TERM: rank 0's code is taken 2 s after it came, so that the
# script says what became of the run whatever the launcher and the other ranks still do,
# and in place of the launcher's (mpirun, given the TERM too, ends with its own code).
ddrl_wait_step() {
  local exited_at="" grace=${DDRL_STEP_GRACE:-60} i sent_at=$SECONDS
  while kill -0 "$step_pid" 2>/dev/null; do
    if [ -n "$stop" ] && [ $((SECONDS - sent_at)) -ge 5 ]; then
      kill -USR1 "$step_pid" 2>/dev/null
      sent_at=$SECONDS
    fi
    if [ -s "$DDRL_EXIT_FILE" ]; then
      exited_at=${exited_at:-$SECONDS}
      [ "$stop" = cancel ] && [ $((SECONDS - exited_at)) -ge 2 ] && break
      if [ $((SECONDS - exited_at)) -ge "$grace" ]; then
        echo "ddrl: error: rank 0 exited (code $(<"$DDRL_EXIT_FILE")) $grace s ago but the step's launcher is still there: ending it (DDRL_STEP_GRACE)" >&2
        kill -TERM "$step_pid" 2>/dev/null
        for ((i = 0; i < 10; i++)); do kill -0 "$step_pid" 2>/dev/null && sleep 1; done
        kill -KILL "$step_pid" 2>/dev/null
        wait "$step_pid"
        return "$(<"$DDRL_EXIT_FILE")"
      fi
    fi
    # A foreground sleep, so that a trapped signal's handler runs within a second.
    sleep 1
  done
  if [ "$stop" = cancel ] && [ -s "$DDRL_EXIT_FILE" ]; then
    return "$(<"$DDRL_EXIT_FILE")"
  fi
  wait "$step_pid"
}

# The run directory DIR of TRAIN_ARGS... (they hold `--out DIR`).
ddrl_run_dir() {
  while [ $# -gt 1 ]; do
    if [ "$1" = --out ]; then
      echo "$2"
      return
    fi
    shift
  done
}

# A field of the job as Slurm holds it now (its environment keeps what it started with).
ddrl_alloc() {
  # A heterogeneous job has a line per component: the first (the learner's) answers.
  scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | head -1 | grep -o " $1=[^ ]*" | cut -d= -f2
}

# How many nodes the job holds now.
ddrl_alloc_nodes() {
  ddrl_alloc NumNodes
}

# After a node failure (the scripts ask for --no-kill, so the job keeps the nodes left) the
# next step runs on the nodes still allocated, with as many tasks per node as before.
ddrl_shrink() {
  local nodes per_node hosts
  # A heterogeneous job restarts on its components as they are.
  [ "${SLURM_HET_SIZE:-1}" -eq 1 ] || return 0
  # SLURM_NTASKS_PER_NODE reads like "2" or "2(x3)".
  per_node=${SLURM_NTASKS_PER_NODE:-}
  per_node=${per_node%%[!0-9]*}
  [ -n "${SLURM_JOB_ID:-}" ] && [ -n "$per_node" ] || return 0
  nodes=$(ddrl_alloc_nodes)
  [ -n "$nodes" ] && [ "$nodes" -lt "${SLURM_JOB_NUM_NODES:-$nodes}" ] || return 0
  if [ "${launcher[0]}" = srun ]; then
    launcher+=(--nodes="$nodes" --ntasks="$((nodes * per_node))")
  else
    # mpirun reads the node list Slurm set at the start, the lost node in it: name the others.
    hosts=$(scontrol show hostnames "$(ddrl_alloc NodeList)" | sed "s/\$/:$per_node/" | paste -sd, -)
    launcher+=(-n "$((nodes * per_node))" --host "$hosts")
  fi
}

# Before a restart: until every node still allocated runs a trivial step. Slurm notices a
# dead node only after SlurmdTimeout; until then a new step would be sent to it and fail.
# Once the node is down, --no-kill drops it from the allocation and the probe passes on the
# nodes left. Gives up after DDRL_RESTART_WAIT seconds (default 600).
ddrl_settle() {
  local nodes deadline=$((SECONDS + ${DDRL_RESTART_WAIT:-600}))
  [ "${DDRL_LAUNCHER:-srun}" = srun ] && [ -n "${SLURM_JOB_ID:-}" ] || return 0
  while :; do
    nodes=$(ddrl_alloc_nodes)
    timeout 60 srun --nodes="${nodes:-1}" --ntasks="${nodes:-1}" --ntasks-per-node=1 true \
      >/dev/null 2>&1 && return 0
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 5
  done
}

ddrl_main() {
  # Both signals become USR1 for the step: srun and mpirun take TERM as "kill the ranks now",
  # ddrl ranks take USR1 as "checkpoint and stop". What follows differs: USR1 is Slurm's
  # time-limit warning (--signal=B:USR1@...), so the job is requeued to go on; TERM is a
  # cancel (scancel), so the job stays ended. (Before a preemption Slurm sends TERM too, and
  # requeues a preempted job itself.)
  local step_pid="" stop=""
  trap 'stop=warning; [ -z "$step_pid" ] || kill -USR1 "$step_pid" 2>/dev/null' USR1
  trap 'stop=cancel; [ -z "$step_pid" ] || kill -USR1 "$step_pid" 2>/dev/null' TERM

  if [ $# -eq 0 ] || [[ $1 == -* ]]; then
    [ -n "${DDRL_JOB:-}" ] || ddrl_die "no job file: pass JOB.toml as the first argument or set DDRL_JOB"
    set -- "$DDRL_JOB" "$@"
  fi
  [ -z "${DDRL_OUT:-}" ] || set -- "$1" --out "$DDRL_OUT" "${@:2}"

  local ddrl resolved rc attempt=0 max_restarts=${DDRL_MAX_RESTARTS:-3}
  local -a train_args launcher step
  ddrl_find
  [[ $max_restarts =~ ^[0-9]+$ ]] || ddrl_die "DDRL_MAX_RESTARTS=$max_restarts: expected a whole number"
  [[ ${DDRL_STEP_GRACE:-60} =~ ^[0-9]+$ ]] || ddrl_die "DDRL_STEP_GRACE=$DDRL_STEP_GRACE: expected a whole number of seconds"
  DDRL_EXIT_FILE=$(mktemp "${TMPDIR:-/tmp}/ddrl-exit.XXXXXX") || ddrl_die "cannot create a file in ${TMPDIR:-/tmp}"
  export DDRL_EXIT_FILE
  trap 'rm -f "$DDRL_EXIT_FILE"' EXIT
  while :; do
    ddrl_launcher
    # Also the fail-fast check: a bad job file stops here with one `ddrl: error:` line,
    # before any MPI rank starts. After a failure it finds the checkpoint to resume from.
    resolved=$("$ddrl" slurm --resolve "$@") || exit
    mapfile -t train_args <<< "$resolved"

    echo "ddrl: job ${SLURM_JOB_ID:-?} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-?}: ${launcher[*]}${SLURM_HET_SIZE:+ (${SLURM_HET_SIZE} components)} $ddrl train ${train_args[*]}"
    ddrl_step bash -c "$DDRL_RANK_SH" ddrl-rank "$ddrl" train "${train_args[@]}"
    : > "$DDRL_EXIT_FILE"
    "${step[@]}" &
    step_pid=$!
    [ -z "$stop" ] || kill -USR1 "$step_pid"
    ddrl_wait_step
    rc=$?
    step_pid=""
    # A rank or node lost (killed, crashed, or silent past sync.timeout: exit 4) ends the
    # step; the job goes on from the last checkpoint on what is left of the allocation.
    if [ "$rc" -eq 0 ] || [ "$rc" -eq "$DDRL_EXIT_RESUMABLE" ] || [ -n "$stop" ] \
       || [[ " $DDRL_EXIT_FINAL " == *" $rc "* ]]; then
      break
    fi
    if [ "$attempt" -ge "$max_restarts" ]; then
      echo "ddrl: error: the step failed (exit $rc) and the job has restarted $attempt time(s), its limit (DDRL_MAX_RESTARTS=$max_restarts)" >&2
      break
    fi
    attempt=$((attempt + 1))
    echo "ddrl: the step failed (exit $rc): restart $attempt of $max_restarts from the last checkpoint"
    if ! ddrl_settle; then
      echo "ddrl: error: the allocation's nodes did not answer within ${DDRL_RESTART_WAIT:-600} s after the failure" >&2
      break
    fi
  done
  trap - USR1 TERM

  if [ "$rc" -eq "$DDRL_EXIT_RESUMABLE" ] && [ "$stop" = cancel ]; then
    echo "ddrl: cancelled: checkpointed, not requeued (submit again with the same --out to go on)"
  elif [ "$rc" -eq "$DDRL_EXIT_RESUMABLE" ]; then
    # The requeued job keeps its id, so the next start finds the checkpoint and resumes.
    # `ddrl status` says "requeued" while DIR/requeued (the job id) is newer than the run's
    # log: the resumed run rewrites its log first thing. Marked and said before the request,
    # because Slurm kills this script as soon as it takes the requeue.
    local dir
    dir=$(ddrl_run_dir "${train_args[@]}")
    [ -z "$dir" ] || echo "$SLURM_JOB_ID" > "$dir/requeued" || true
    echo "ddrl: checkpointed; requeueing job $SLURM_JOB_ID"
    if ! scontrol requeue "$SLURM_JOB_ID"; then
      [ -z "$dir" ] || rm -f "$dir/requeued"
      echo "ddrl: error: checkpointed, but the requeue failed: submit again with the same --out to resume" >&2
    fi
  fi
  exit "$rc"
}
