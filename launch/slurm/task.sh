#!/bin/sh
# One srun task of an asyncps fleet; its rank is SLURM_PROCID.
#   task.sh server RUN_DIR BIN_DIR NUM_SHARDS NUM_WORKERS [extra ps_server flags]
#   task.sh worker RUN_DIR BIN_DIR NUM_SHARDS NUM_WORKERS SERVERS [extra ps_worker flags]
#   task.sh etcd RUN_DIR BIN_DIR NUM_SHARDS NUM_WORKERS CLIENT_PORT PEER_PORT [tls PREFIX]
#     (replicated fleets: the etcd holding the replica layout and leases; it
#     writes RUN_DIR/ready/etcd.endpoint once it serves; with `tls PREFIX`,
#     psrun --etcd_tls: https with certificates made for this host in
#     RUN_DIR/etcd/tls, client certificates required, and etcd's users and
#     authentication on (launch/pslaunch/etcd_tls.py) before it writes it)
#   task.sh cmd RUN_DIR BIN_DIR NUM_SHARDS NUM_WORKERS SERVERS COMMAND [args]
#     (psrun --worker_cmd: COMMAND, a shell command line, runs with the args
#     appended and the ASYNCPS_* environment contract, launch/pslaunch/workercmd.py)
# RUN_DIR must be on a disk every node shares: shards write their bound endpoint to
# RUN_DIR/ready/server-<rank>.endpoint (and the host to reach it at to .host),
# psrun reads them and passes SERVERS to the worker step.
# Environment: PSRUN_BIND_HOST (address shards bind, default *),
# PSRUN_ADVERTISE_HOST (address workers use, default `hostname`),
# PSRUN_REPLICAS (replicated fleets: processes per shard; server task rank
# r is replica r % R of shard r / R, named server-<shard>-r<replica>),
# PSRUN_SHARD_OFFSET (psrun --elastic: a shard added later, a step of its own:
# server task r is shard OFFSET + r, or with PSRUN_REPLICAS=R replica r of
# shard OFFSET; NUM_SHARDS is then OFFSET + 1).
set -eu
role=$1 run=$2 bin=$3 shards=$4 workers=$5
shift 5
rank=${SLURM_PROCID:?task.sh runs under srun (SLURM_PROCID unset)}
name=$role-$rank
replicas=${PSRUN_REPLICAS:-1}
case $role in
  etcd)
    host=${PSRUN_ADVERTISE_HOST:-$(hostname)}
    scheme=http tls= prefix=
    if [ "${3:-}" = tls ]; then
      scheme=https tls="$run/etcd/tls" prefix=$4
    fi
    client="$scheme://$host:$1" peer="http://$host:$2"
    mkdir -p "$run/ready" "$run/etcd"
    # etcd_tls.py, run from this checkout's launch/ folder.
    launch=$(cd "$(dirname "$0")/.." && pwd)
    etcd_tls() { PYTHONPATH="$launch" python3 -m pslaunch.etcd_tls "$@"; }
    if [ -n "$tls" ] && ! etcd_tls ensure "$tls" "$host"; then
      echo "task.sh: no certificates for etcd in $tls" >&2
      exit 1
    fi
    # Short leases as psrun's local etcd (launch/pslaunch/etcd.py).
    set -- /usr/bin/etcd --name=asyncps --data-dir="$run/etcd/data" \
      --listen-client-urls="$client" --advertise-client-urls="$client" \
      --listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer" \
      --initial-cluster="asyncps=$peer" --heartbeat-interval=50 --election-timeout=250
    if [ -n "$tls" ]; then
      # etcd_tls.etcd_server_flags(): its certificate, client certificates
      # required, bcrypt cost 4 (random passwords; see there).
      set -- "$@" --cert-file="$tls/server.pem" --key-file="$tls/server.key" \
        --trusted-ca-file="$tls/ca.pem" --client-cert-auth --bcrypt-cost=4
    fi
    echo "# psrun: etcd-$rank started $(date '+%Y-%m-%d %H:%M:%S') on $(hostname) (slurm job ${SLURM_JOB_ID:-?}, step ${SLURM_STEP_ID:-?})"
    echo "# psrun: command: $*"
    "$@" &
    pid=$!
    trap 'kill -TERM $pid 2>/dev/null' TERM INT
    healthy() {
      if [ -n "$tls" ]; then
        etcd_tls health "$tls" "$client" >/dev/null 2>&1
      else
        curl -fs "$client/health" >/dev/null 2>&1 ||
          python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$client/health" >/dev/null 2>&1
      fi
    }
    i=0
    while ! healthy; do
      i=$((i + 1))
      if [ $i -gt 150 ] || ! kill -0 $pid 2>/dev/null; then
        echo "task.sh: etcd did not become healthy at $client" >&2
        kill -TERM $pid 2>/dev/null
        exit 1
      fi
      sleep 0.1
    done
    if [ -n "$tls" ] && ! etcd_tls auth "$tls" "$client" "$prefix"; then
      echo "task.sh: etcd's users and authentication could not be made" >&2
      kill -TERM $pid 2>/dev/null
      exit 1
    fi
    printf '%s\n' "$client" > "$run/ready/etcd.endpoint.tmp"
    mv "$run/ready/etcd.endpoint.tmp" "$run/ready/etcd.endpoint"
    wait $pid
    exit $? ;;
  server)
    mkdir -p "$run/ready" "$run/db"
    shard=$((rank + ${PSRUN_SHARD_OFFSET:-0}))
    name=server-$shard
    if [ "$replicas" -gt 1 ]; then
      shard=$((rank / replicas + ${PSRUN_SHARD_OFFSET:-0}))
      name=server-$shard-r$((rank % replicas))
      set -- "$@" --replicas="$replicas" --replica=$((rank % replicas))
    fi
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
    set -- "$bin/ps_server" --flagfile="$run/flags/server.flags" --shard_id="$shard" \
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
    echo "task.sh: unknown role '$role' (etcd, server, worker, cmd)" >&2
    exit 2 ;;
esac
echo "# psrun: $name started $(date '+%Y-%m-%d %H:%M:%S') on $(hostname) (slurm job ${SLURM_JOB_ID:-?}, step ${SLURM_STEP_ID:-?}, task $rank of ${SLURM_NTASKS:-?})"
echo "# psrun: command: $*"
exec "$@"
