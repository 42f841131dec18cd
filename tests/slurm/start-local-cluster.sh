#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (Debian's slurm 22.05 + munge), for the Slurm
# executor's integration test and for trying `--executor slurm` by hand. Needs root. Idempotent:
# installs the packages only when missing, rewrites the config only when it changed, and returns
# at once when our cluster already answers `sinfo`.
#
# Partitions: `debug` (default, no time limit) and `short` (MaxTime=1 minute: a job asking for
# more is rejected, a job that runs longer is killed with state TIMEOUT within ~1.5 minutes).
# OverTimeLimit=0 and KillWait=2 make that kill prompt; MinJobAge=30 keeps finished jobs visible
# to `scontrol show job` long enough for the executor's poller but not much longer.
# CPUs are not consumed exclusively (OverSubscribe=FORCE:4): up to 4 jobs share a CPU, so the
# tests' jobs never queue behind each other on a small machine. Memory is: a job gets --mem or
# 1 GB per CPU, and jobacct_gather/linux with OverMemoryKill kills a job that uses more (checked
# every second; without cgroups Slurm reports it as FAILED, with a note in the job's output).
#
# Usage: sudo tests/slurm/start-local-cluster.sh        (exit 0 when `sinfo` answers)
#        tests/slurm/start-local-cluster.sh --stop      (stop the daemons it started)
set -euo pipefail

STATE=/var/lib/rredcot-slurm
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MARK="# rredcot local test cluster"

log() { echo "start-local-cluster: $*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
    log "must run as root (installs packages, starts daemons)"
    exit 2
fi

stop() {
    for pidf in /run/rredcot-slurmd.pid /run/rredcot-slurmctld.pid; do
        if [[ -s $pidf ]]; then kill "$(cat "$pidf")" 2>/dev/null || true; rm -f "$pidf"; fi
    done
}
if [[ ${1:-} == --stop ]]; then
    stop
    exit 0
fi

# 1. Packages (only what is missing; no recommends: the client tools, the two daemons, munge).
need=()
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v sbatch >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
if ((${#need[@]})); then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. munge, as the munge user with the packaged key.
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    rm -f /run/munge/munge.socket.2 /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n | unmunge >/dev/null || { log "munged does not answer"; exit 1; }
fi

# 3. slurm.conf: one node (this host), two partitions, no accounting.
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" /var/log/slurm
new_conf=$(cat <<CONF
$MARK (written by tests/slurm/start-local-cluster.sh)
ClusterName=rredcot
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=1024
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
JobCompType=jobcomp/none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=/run/rredcot-slurmctld.pid
SlurmdPidFile=/run/rredcot-slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
MinJobAge=30
KillWait=2
OverTimeLimit=0
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP
PartitionName=short Nodes=$host MaxTime=1 DefaultTime=1 OverSubscribe=FORCE:4 State=UP
CONF
)

answers() { timeout 5 sinfo -h -o %P >/dev/null 2>&1; }

if [[ -f $CONF ]] && [[ "$(cat "$CONF")" == "$new_conf" ]] && answers \
    && [[ $(timeout 5 sinfo -h -N -o %t | head -1) =~ ^(idle|mix|alloc) ]]; then
    log "cluster already up"
    exit 0
fi
if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
    log "$CONF exists and was not written by this script; leaving it alone"
    answers && exit 0
    exit 1
fi
printf '%s\n' "$new_conf" >"$CONF"

# 4. Daemons (restarted so they read the config).
stop
sleep 0.5
log "starting slurmctld and slurmd (node $host, $cpus CPUs, ${mem_mb} MB)"
/usr/sbin/slurmctld -i
/usr/sbin/slurmd
for _ in $(seq 100); do
    state=$(timeout 5 sinfo -h -N -o %t 2>/dev/null | head -1 || true)
    if [[ $state =~ ^(idle|mix|alloc) ]]; then
        log "cluster up: $(sinfo -h -o '%P %a %l %D %t' | tr '\n' ';')"
        exit 0
    fi
    if [[ $state =~ ^(down|drain) ]]; then
        scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
    fi
    sleep 0.2
done
log "the cluster did not come up; sinfo says:"
sinfo >&2 || true
tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
