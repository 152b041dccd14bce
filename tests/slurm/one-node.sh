#!/usr/bin/env bash
# Start-up under Slurm: a one-node Slurm cluster on this machine (munge, slurmctld and slurmd
# with a configuration of their own under a temporary directory; /etc/slurm is not touched),
# then the whole multi-process suite launched by `srun --mpi=pmix` (Slurm's PMIx v4 plugin),
# with the fabric the environment selects (shm by default). Installs slurm-wlm and munge with
# apt-get when they are missing. Says why and fails when Slurm cannot be brought up, never
# skips silently. Needs root (the daemons run as root here).
#
# usage: [WEFT_FABRIC=ofi WEFT_SAME_HOST=ofi WEFT_OFI_PROVIDER=tcp WEFT_OFI_DOMAIN=lo] \
#        tests/slurm/one-node.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d /tmp/weft-slurm.XXXXXX)
export SLURM_CONF=$dir/slurm.conf
started_munge=0
cleanup() {
    scontrol shutdown >/dev/null 2>&1 || true
    local pids=()
    for f in "$dir"/ctld.pid "$dir"/d.pid; do
        [ -s "$f" ] && pids+=("$(cat "$f")")
    done
    [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null || true
    # The daemons write their state while they stop: remove the directory once they are gone.
    for _ in $(seq 50); do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    [ "$started_munge" = 1 ] && pkill -x munged 2>/dev/null || true
    rm -rf "$dir" 2>/dev/null || true
}
fail() {
    echo "Slurm test cannot run: $*" >&2
    for log in "$dir"/*.log; do [ -f "$log" ] && { echo "--- $log"; tail -20 "$log"; } >&2; done
    cleanup
    exit 1
}
trap cleanup EXIT
if ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null \
        || fail "apt-get install slurm-wlm munge failed"
fi
# munge: the key the package made, the daemon as the munge user.
[ -s /etc/munge/munge.key ] || mungekey --create >/dev/null 2>&1 || fail "no munge key"
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    su -s /bin/sh munge -c /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force \
        || fail "munged does not start"
    started_munge=1
    sleep 0.5
    munge -n </dev/null | unmunge >/dev/null 2>&1 || fail "munge credentials do not verify"
fi
host=$(hostname -s)
mkdir -p "$dir"/spool "$dir"/state
cat >"$SLURM_CONF" <<CONF
ClusterName=weft-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/ctld.log
SlurmdLogFile=$dir/d.log
SlurmctldPidFile=$dir/ctld.pid
SlurmdPidFile=$dir/d.pid
SlurmctldPort=16817
SlurmdPort=16818
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host CPUs=8 State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
slurmctld -i || fail "slurmctld does not start"
slurmd || fail "slurmd does not start"
for try in $(seq 100); do
    sinfo -h -o %t 2>/dev/null | grep -q idle && break
    [ "$try" = 100 ] && fail "the node never became idle: $(sinfo 2>&1)"
    sleep 0.2
done
echo "Slurm: $(srun --version), node $host idle"
srun -n 2 true || fail "srun cannot start a job"
srun --mpi=list 2>&1 | grep -q pmix || fail "Slurm has no PMIx plugin (srun --mpi=list)"
# What srun adds is the start-up through Slurm's PMIx server; CI runs it with shared memory
# (the libfabric address exchange over PMIx is the code path mpirun runs with tcp).
WEFT_TEST_LAUNCHER=srun cargo test --features cluster --test multirank "$@"
# OpenSHMEM jobs over libfabric's shm provider leave no provider region in /dev/shm
# (shmem_finalize closes the endpoint; issue 51): 20 of them under srun.
cargo build -q --features cluster
target/debug/weft cc -std=c11 tests/shmem/setup.c -o "$dir/setup"
regions() { ls /dev/shm | grep -cE '^[0-9]+:[0-9]+:[0-9]+$' || true; }
before=$(regions)
for _ in $(seq 20); do
    WEFT_FABRIC=ofi WEFT_SAME_HOST=ofi WEFT_OFI_PROVIDER=shm \
        srun --mpi=pmix -n 2 --oversubscribe --time=2 "$dir/setup" | grep -q "setup: 2 PEs ok"
done
after=$(regions)
if [ "$after" -gt "$before" ]; then
    echo "srun: 20 OpenSHMEM jobs over the shm provider left $((after - before)) regions in /dev/shm" >&2
    exit 1
fi
echo "srun: 20 OpenSHMEM jobs over the shm provider left no region in /dev/shm"
