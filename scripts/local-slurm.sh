#!/usr/bin/env bash
# A real two-node SLURM cluster on this one host, for pdbench's tests and demos.
#
#   scripts/local-slurm.sh start    install (Debian packages) when missing, configure, start, wait idle
#   scripts/local-slurm.sh stop     stop the daemons this script started (pid files), nothing else
#   scripts/local-slurm.sh status   sinfo, and which daemons are up
#   scripts/local-slurm.sh env      print `export SLURM_CONF=...` for this cluster
#
# Layout: munged, slurmctld and two slurmd daemons (`slurmd -N node1`, `slurmd -N node2`), each
# node with its own loopback address in /etc/hosts (node1 -> 127.0.10.1, node2 -> 127.0.10.2)
# and its own slurmd port, so a task finds its node's address by name like on a real cluster.
# No accounting (no slurmdbd): `sacct` does not work here; pdbench reads job state from
# squeue/scontrol instead (pdbench/driver/executors.py). Finished jobs are also logged by
# jobcomp/filetxt to $PDBENCH_SLURM_DIR/jobcomp.log.
#
# Settings (environment):
#   PDBENCH_SLURM_DIR        state dir (config, spool, logs, pid files)  [/var/tmp/pdbench-slurm]
#   PDBENCH_SLURM_NET        first three octets of the node addresses    [127.0.10]
#   PDBENCH_SLURM_PORT       slurmctld port                              [6817]
#   PDBENCH_SLURMD_PORT      port of node1's slurmd, node2 gets +1       [17001]
#   PDBENCH_SLURM_PARTITION  partition name                              [pdbench]
#   PDBENCH_SLURM_WAIT_S     how long `start` waits for idle nodes       [60]
#
# The config is written to $PDBENCH_SLURM_DIR/slurm.conf and linked from /etc/slurm/slurm.conf
# when that path is free or already ours, so plain `sinfo`/`sbatch` find it; otherwise export
# SLURM_CONF (see `env`).
set -euo pipefail

STATE_DIR=${PDBENCH_SLURM_DIR:-/var/tmp/pdbench-slurm}
NET=${PDBENCH_SLURM_NET:-127.0.10}
CTLD_PORT=${PDBENCH_SLURM_PORT:-6817}
SLURMD_PORT=${PDBENCH_SLURMD_PORT:-17001}
PARTITION=${PDBENCH_SLURM_PARTITION:-pdbench}
WAIT_S=${PDBENCH_SLURM_WAIT_S:-60}
NODES=(node1 node2)
CONF="$STATE_DIR/slurm.conf"
ETC_CONF=/etc/slurm/slurm.conf
MARK="pdbench-local-slurm"
MUNGE_SOCKET=/run/munge/munge.socket.2

log() { echo "local-slurm: $*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages, edits /etc/hosts, runs slurmd)"
}

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  [[ ${#missing[@]} -eq 0 ]] && return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# Add "ADDR NAME  # pdbench-local-slurm" for each node unless NAME already maps to ADDR.
ensure_hosts() {
  local i name addr
  for i in "${!NODES[@]}"; do
    name=${NODES[$i]}
    addr="$NET.$((i + 1))"
    if awk -v a="$addr" -v n="$name" '$1 == a { for (i = 2; i <= NF; i++) if ($i == n) f = 1 }
                                     END { exit !f }' /etc/hosts; then
      continue
    fi
    if awk -v n="$name" '$1 !~ /^#/ { for (i = 2; i <= NF; i++) if ($i == n) f = 1 } END { exit !f }' \
      /etc/hosts; then
      die "/etc/hosts maps $name to another address; remove that line or set PDBENCH_SLURM_NET"
    fi
    [[ -z $(tail -c 1 /etc/hosts) ]] || echo >>/etc/hosts
    echo "$addr $name  # $MARK" >>/etc/hosts
    log "added '$addr $name' to /etc/hosts"
  done
}

write_conf() {
  local cpus mem_mb node_mem i tmp
  cpus=$(nproc)
  mem_mb=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
  # Both nodes share the host: each advertises every core (SLURM allows it; the scheduler may
  # then run one task per node at full width) and half the memory, so --mem never overbooks.
  node_mem=$((mem_mb / 2 - 256))
  mkdir -p "$STATE_DIR"/{state,spool,log,run}
  tmp=$(mktemp "$STATE_DIR/slurm.conf.XXXXXX")
  cat >"$tmp" <<EOF
# $MARK: written by scripts/local-slurm.sh; rewritten on every start.
ClusterName=pdbench
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE_DIR/state
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$STATE_DIR/run/slurmctld.pid
SlurmdPidFile=$STATE_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SchedulerType=sched/backfill
# Backfill every 2 s (default 30): a requeued job, eligible again after cred_expire, starts
# within seconds instead of at the next 30-s pass.
SchedulerParameters=bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=60
MinJobAge=600
# Batch jobs may be requeued (scontrol requeue, submitit's checkpoint at the time limit).
JobRequeue=1
# A requeued job may start again after cred_expire seconds (default 120): short here, so
# that the requeue tests (tests/e2e/test_slurm_runs.py) wait seconds, not minutes (the
# driver, asking squeue every 10 s, still sees each wait: "PENDING (BeginTime)").
AuthInfo=cred_expire=20
MailProg=/bin/true
# No slurmdbd here: no accounting, no sacct. Finished jobs are logged to a text file.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE_DIR/jobcomp.log
EOF
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeAddr=$NET.$((i + 1)) NodeHostname=$(hostname)" \
      "Port=$((SLURMD_PORT + i)) CPUs=$cpus RealMemory=$node_mem State=UNKNOWN" >>"$tmp"
  done
  echo "PartitionName=$PARTITION Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES" \
    "MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$tmp"
  mv "$tmp" "$CONF"
  chmod 644 "$CONF"
  if [[ ! -e $ETC_CONF && ! -L $ETC_CONF ]] || [[ $(readlink "$ETC_CONF" || true) == "$CONF" ]]; then
    mkdir -p "$(dirname "$ETC_CONF")"
    ln -sfn "$CONF" "$ETC_CONF"
  else
    log "$ETC_CONF exists and is not ours: export SLURM_CONF=$CONF to use this cluster"
  fi
}

# pid_alive PIDFILE NAME: the pid in PIDFILE runs and its command name is NAME (so a recycled
# pid is never taken for one of ours).
pid_alive() {
  local pid
  [[ -s $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/comm ]] || return 1
  [[ $(<"/proc/$pid/comm") == "$2" ]]
}

# wait_for DESCRIPTION SECONDS COMMAND...: poll COMMAND every 0.5 s until it succeeds.
wait_for() {
  local what=$1 limit=$2 deadline
  shift 2
  deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what"
    sleep 0.5
  done
}

munge_ok() {
  munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1
}

start_munge() {
  if munge_ok; then
    return 0 # a munged is up (ours or the system's): use it
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge
  [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing (reinstall munge)"
  rm -f /run/munge/munged.pid
  runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file=/run/munge/munged.pid
  wait_for "munged" 20 munge_ok
  # munged writes its pid file as the munge user; keep our own copy: `stop` reads only ours.
  cp /run/munge/munged.pid "$STATE_DIR/run/munged.pid"
  log "munged started (pid $(<"$STATE_DIR/run/munged.pid"))"
}

nodes_state() {
  SLURM_CONF=$CONF sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | sort -u
}

all_idle() {
  local states
  states=$(nodes_state)
  [[ $(grep -c ' idle$' <<<"$states") -eq ${#NODES[@]} ]]
}

# The daemons outlive this script: they must not keep a descriptor its caller opened (a lock
# held with `flock`, the pipe a CI log is read from), or that lock is never released and that
# pipe never ends. Bash reads this script on fd 255 (close-on-exec): left open.
close_inherited_fds() {
  local fd
  for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    if ((fd > 2 && fd < 255)); then
      eval "exec $fd>&-" 2>/dev/null || true
    fi
  done
}

cmd_start() {
  need_root
  close_inherited_fds
  install_packages
  ensure_hosts
  write_conf
  start_munge
  if pid_alive "$STATE_DIR/run/slurmctld.pid" slurmctld; then
    SLURM_CONF=$CONF scontrol reconfigure >/dev/null 2>&1 || true
  else
    # A fresh controller starts from a clean state (-c): jobs saved by a controller that is
    # gone (a reboot, a VM restored from a snapshot taken mid-test) ran on slurmds that are
    # gone too, and recovering them would hold the nodes "alloc" until they time out.
    slurmctld -c -f "$CONF"
    wait_for "slurmctld" 30 env SLURM_CONF="$CONF" scontrol ping
    log "slurmctld started (pid $(<"$STATE_DIR/run/slurmctld.pid"))"
  fi
  local node
  for node in "${NODES[@]}"; do
    if ! pid_alive "$STATE_DIR/run/slurmd-$node.pid" slurmd; then
      mkdir -p "$STATE_DIR/spool/$node"
      slurmd -f "$CONF" -N "$node"
      wait_for "slurmd $node" 30 pid_alive "$STATE_DIR/run/slurmd-$node.pid" slurmd
      log "slurmd $node started (pid $(<"$STATE_DIR/run/slurmd-$node.pid"))"
    fi
  done
  local deadline=$((SECONDS + WAIT_S)) resumed=0
  until all_idle; do
    # Nodes left down/drained by an earlier unclean stop come back once they respond again.
    if ((!resumed)) && nodes_state | grep -Eq ' (down|drain|drng|fail)[*~#%]?$'; then
      SLURM_CONF=$CONF scontrol update NodeName="$(IFS=,; echo "${NODES[*]}")" State=RESUME \
        >/dev/null 2>&1 || true
      resumed=1
    fi
    if ((SECONDS >= deadline)); then
      nodes_state >&2 || true
      die "nodes not idle after ${WAIT_S}s; logs in $STATE_DIR/log"
    fi
    sleep 0.5
  done
  log "up: $(nodes_state | tr '\n' ' ')(SLURM_CONF=$CONF)"
}

# stop_daemon NAME PIDFILE: SIGTERM the pid in PIDFILE if it is NAME; wait (bounded) for it to exit.
stop_daemon() {
  local name=$1 pidfile=$2 pid i
  if ! pid_alive "$pidfile" "$name"; then
    rm -f "$pidfile"
    return 0
  fi
  pid=$(<"$pidfile")
  kill -TERM "$pid"
  for ((i = 0; i < 60; i++)); do
    [[ -d /proc/$pid ]] || break
    sleep 0.5
  done
  [[ -d /proc/$pid ]] && { log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"; kill -KILL "$pid"; }
  rm -f "$pidfile"
  log "$name stopped (pid $pid)"
}

cmd_stop() {
  need_root
  local node
  for node in "${NODES[@]}"; do
    stop_daemon slurmd "$STATE_DIR/run/slurmd-$node.pid"
  done
  stop_daemon slurmctld "$STATE_DIR/run/slurmctld.pid"
  stop_daemon munged "$STATE_DIR/run/munged.pid"
}

cmd_status() {
  local node up=0
  if pid_alive "$STATE_DIR/run/munged.pid" munged; then
    echo "munged: up (pid $(<"$STATE_DIR/run/munged.pid"))"
  else
    echo "munged: not started by this script"
  fi
  if pid_alive "$STATE_DIR/run/slurmctld.pid" slurmctld; then
    echo "slurmctld: up (pid $(<"$STATE_DIR/run/slurmctld.pid"))"
    up=1
  else
    echo "slurmctld: down"
  fi
  for node in "${NODES[@]}"; do
    if pid_alive "$STATE_DIR/run/slurmd-$node.pid" slurmd; then
      echo "slurmd $node: up (pid $(<"$STATE_DIR/run/slurmd-$node.pid"))"
    else
      echo "slurmd $node: down"
    fi
  done
  if ((up)); then
    SLURM_CONF=$CONF sinfo -N -o '%N %P %t %c %m %o'
  fi
  ((up))
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *)
    echo "usage: $0 start|stop|status|env" >&2
    exit 2
    ;;
esac
