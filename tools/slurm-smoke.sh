#!/bin/bash
# Slurm smoke test: a one-node Slurm cluster on localhost runs the sweep script of docs/sweeps.md
# (tools/slurm-sweep.sbatch) as an array job, one shard per task; the merged results.csv must be
# byte-identical to the unsharded sweep's. Installs slurm-wlm and munge from Debian's packages
# when they are missing (as root), writes every config and state file to a temporary directory,
# and stops the daemons it started, by pid.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tasks=4
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "slurm-smoke: installing slurm-wlm and munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; }
  else
    echo "slurm-smoke: needs slurm-wlm and munge (apt-get install slurm-wlm munge, as root)" >&2
    exit 2
  fi
fi
cargo build --release --locked -q
bin="$root/target/release"

work=$(mktemp -d)
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap stop EXIT

# munge: its own key, socket and files, run as root (--force).
mkdir -p "$work/munge" && chmod 700 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1 count=1024 status=none
chmod 400 "$work/munge/munge.key"
munged --force --foreground --key-file="$work/munge/munge.key" \
  --socket="$work/munge/munge.socket" --pid-file="$work/munge/munged.pid" \
  --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" \
  > "$work/munge/munged.out" 2>&1 &
pids+=($!)

mkdir -p "$work/state" "$work/spool"
port=$((20000 + RANDOM % 20000))
cat > "$work/slurm.conf" <<CONF
ClusterName=smoke
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName=localhost CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=smoke Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$work/slurm.conf"
for _ in $(seq 50); do [[ -S "$work/munge/munge.socket" ]] && break; sleep 0.1; done
slurmctld -D -i -f "$SLURM_CONF" > "$work/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" > "$work/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 120); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  sleep 0.5
done
sinfo -h -o %T | grep -q idle || { echo "slurm-smoke: the node never came up" >&2; cat "$work"/*.log >&2; exit 1; }

# The docs' script, as an array job of $tasks shards, run where the sweep can find its files.
run="$work/run"
mkdir -p "$run"
cp -r scenarios "$run/"
sbatch --wait --quiet --array="1-$tasks" --cpus-per-task=1 --chdir="$run" \
  --output="$work/shard-%a.log" --export="ALL,PATH=$bin:$PATH" tools/slurm-sweep.sbatch
sweep=scenarios/sweeps/policy-vs-cancel-rate.ron
(cd "$run" && "$bin/cancelsim" merge "$sweep" sweep/shard-* --out sweep/all > /dev/null)
(cd "$run" && "$bin/cancelsim" sweep "$sweep" --out whole > /dev/null)
cat "$work"/shard-*.log
cmp "$run/sweep/all/results.csv" "$run/whole/results.csv" \
  || { echo "slurm-smoke: merged shards differ from the unsharded sweep" >&2; exit 1; }
echo "slurm-smoke: $tasks array tasks merged byte-identical to the unsharded sweep ($(wc -l < "$run/whole/results.csv") lines)"
