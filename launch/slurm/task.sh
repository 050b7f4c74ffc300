#!/bin/sh
# One srun task of an asyncps fleet; its rank is SLURM_PROCID.
#   task.sh server RUN_DIR BIN_DIR NUM_SHARDS NUM_WORKERS [extra ps_server flags]
#   task.sh worker RUN_DIR BIN_DIR NUM_SHARDS NUM_WORKERS SERVERS [extra ps_worker flags]
#   task.sh cmd RUN_DIR BIN_DIR NUM_SHARDS NUM_WORKERS SERVERS COMMAND [args]
#     (psrun --worker_cmd: COMMAND, a shell command line, runs with the args
#     appended and the ASYNCPS_* environment contract, launch/pslaunch/workercmd.py)
# RUN_DIR must be on a disk every node shares: shards write their bound endpoint to
# RUN_DIR/ready/server-<rank>.endpoint (and the host to reach it at to .host),
# psrun reads them and passes SERVERS to the worker step.
# Environment: PSRUN_BIND_HOST (address shards bind, default *),
# PSRUN_ADVERTISE_HOST (address workers use, default `hostname`).
set -eu
role=$1 run=$2 bin=$3 shards=$4 workers=$5
shift 5
rank=${SLURM_PROCID:?task.sh runs under srun (SLURM_PROCID unset)}
name=$role-$rank
case $role in
  server)
    mkdir -p "$run/ready" "$run/db"
    printf '%s\n' "${PSRUN_ADVERTISE_HOST:-$(hostname)}" > "$run/ready/$name.host"
    bind=${PSRUN_BIND_HOST:-*}
    # ps_server refuses a non-loopback bind without CurveZMQ keys: without
    # keys in the flags, serve unencrypted as an explicit, logged choice.
    case "$bind" in
      127.*) ;;
      *) if ! grep -q -- '--curve_secret_key' "$run/flags/server.flags" 2>/dev/null &&
            ! printf '%s\n' "$@" | grep -q -- '--curve_secret_key'; then
           echo "# psrun: warning: $name binds $bind unencrypted (--insecure); give --curve_secret_key to encrypt" >&2
           set -- "$@" --insecure --allow_remote_admin
         fi ;;
    esac
    set -- "$bin/ps_server" --flagfile="$run/flags/server.flags" --shard_id="$rank" \
      --num_shards="$shards" --num_workers="$workers" --endpoint="tcp://$bind:*" \
      --ready_file="$run/ready/$name.endpoint" --db_path="$run/db/$name" "$@" ;;
  worker)
    servers=$1
    shift
    set -- "$bin/ps_worker" --flagfile="$run/flags/worker.flags" --servers="$servers" \
      --rank="$rank" --num_workers="$workers" --metrics_csv="$run/metrics-$rank.csv" "$@" ;;
  cmd)
    servers=$1 command=$2
    shift 2
    export ASYNCPS_SERVERS="$servers" ASYNCPS_RANK="$rank" ASYNCPS_NUM_WORKERS="$workers" \
      ASYNCPS_NUM_SERVERS="$shards" ASYNCPS_RUN_DIR="$run" \
      ASYNCPS_METRICS_CSV="$run/metrics-$rank.csv" ASYNCPS_BIN_DIR="$bin" \
      PYTHONPATH="$(dirname "$bin")/python${PYTHONPATH:+:$PYTHONPATH}"
    name=worker-$rank
    set -- /bin/sh -c "$command \"\$@\"" "$name" "$@" ;;
  *)
    echo "task.sh: unknown role '$role' (server, worker, cmd)" >&2
    exit 2 ;;
esac
echo "# psrun: $name started $(date '+%Y-%m-%d %H:%M:%S') on $(hostname) (slurm job ${SLURM_JOB_ID:-?}, step ${SLURM_STEP_ID:-?}, task $rank of ${SLURM_NTASKS:-?})"
echo "# psrun: command: $*"
exec "$@"
