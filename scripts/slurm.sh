#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for lipt's `slurm` tests and for trying lipt's SLURM
# paths without a cluster: slurmctld, slurmd, slurmdbd (accounting, which `sacct` and so
# submitit need to see a job end) on a private MariaDB, and munged. Debian's packages, as root.
#   scripts/slurm.sh up   [DIR]   install what is missing, write DIR/slurm.conf, start, wait idle
#   scripts/slurm.sh down [DIR]   cancel the cluster's jobs, stop exactly what `up` started
#   scripts/slurm.sh status [DIR]
# All state (configs, logs, spool, database, PID files) lives under DIR (default: .slurm in the
# repository), but munged's: it runs as the munge user, so its files stay beside its socket in
# /run/munge. Clients find the cluster with SLURM_CONF=DIR/slurm.conf (the tests set it).
set -euo pipefail

cmd="${1:-}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${2:-${LIPT_SLURM_DIR:-$ROOT/.slurm}}"
# Not SLURM's default ports: a real slurmctld on this machine keeps its own.
CTLD_PORT=16817 SLURMD_PORT=16818 DBD_PORT=16819 DB_PORT=16306
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
MUNGE_SOCKET=/run/munge/munge.socket.2  # slurm's client library asks munged here

say() { echo "slurm: $*"; }
die() { echo "error: slurm: $*" >&2; exit 2; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
    local limit=$1 what=$2; shift 2
    for _ in $(seq 1 $((limit * 5))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "$what did not come up in ${limit}s; see $DIR/log"
}

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "needs root to install ${missing[*]} (or install them yourself)"
    command -v apt-get >/dev/null || die "needs apt-get to install ${missing[*]}"
    say "installing ${missing[*]}"
    # The packages' scripts would start the system's own daemons: keep them from it, and put
    # back whatever policy was there before.
    local policy=/usr/sbin/policy-rc.d saved=""
    if [ -e "$policy" ]; then saved="$(mktemp)"; cp -p "$policy" "$saved"; fi
    printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"
    local rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}"; } > "$DIR/log/apt.log" 2>&1 || rc=$?
    if [ -n "$saved" ]; then mv "$saved" "$policy"; else rm -f "$policy"; fi
    [ $rc = 0 ] || die "apt-get install ${missing[*]} failed; see $DIR/log/apt.log"
}

write_configs() {
    local host; host="$(hostname -s)"
    cat > "$DIR/slurm.conf" <<CONF
# Written by scripts/slurm.sh for this host: one node, no cgroups, accounting in slurmdbd.
ClusterName=lipt
SlurmctldHost=$host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits for its credential to expire before it starts again (default 120 s).
AuthInfo=cred_expire=5
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=60
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    cat > "$DIR/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=lipt
StorageLoc=slurm_acct_db
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
CONF
    chmod 600 "$DIR/slurmdbd.conf"  # slurmdbd refuses a config others can read
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        say "munged already answers on $MUNGE_SOCKET: using it (not ours to stop)"
        return 0
    fi
    # munged runs as the munge user, who may not enter DIR (a clone under a private temporary
    # folder): its own files stay beside its socket.
    local home; home="$(dirname "$MUNGE_SOCKET")"
    mkdir -p "$home"
    chown munge:munge "$home"
    chmod 755 "$home"
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" \
        --pid-file="$home/lipt-munged.pid" --log-file="$home/lipt-munged.log" \
        --seed-file="$home/lipt-munged.seed"
    cp "$home/lipt-munged.pid" "$DIR/run/munged.pid"
    wait_for 10 munged sh -c 'munge -n | unmunge'
}

start_database() {
    if [ ! -d "$DIR/db/mysql" ]; then
        mariadb-install-db --user=root --datadir="$DIR/db" --auth-root-authentication-method=normal \
            --skip-test-db > "$DIR/log/mariadb-install.log" 2>&1
    fi
    mariadbd --user=root --datadir="$DIR/db" --socket="$DIR/run/mariadb.sock" --port=$DB_PORT \
        --bind-address=127.0.0.1 --pid-file="$DIR/run/mariadb.pid" \
        --log-error="$DIR/log/mariadb.log" --skip-log-bin > /dev/null 2>&1 &
    wait_for 30 MariaDB mariadb -S "$DIR/run/mariadb.sock" -u root -e "SELECT 1"
    mariadb -S "$DIR/run/mariadb.sock" -u root -e "
        CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'lipt';
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'lipt';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

munge_answers() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

dead_parts() {  # what of the cluster is not running, one a line (nothing: it is up)
    local name
    for name in slurmctld slurmd slurmdbd mariadb; do alive "$DIR/run/$name.pid" || echo "$name"; done
    # munged may be the system's, with no PID file here: every job needs one that answers
    munge_answers || echo munged
}

up() {
    local dead; dead="$(dead_parts | paste -sd ' ' -)"
    if [ -z "$dead" ]; then
        say "already up ($DIR)"; echo "export SLURM_CONF=$DIR/slurm.conf"; return 0
    fi
    local name
    for name in slurmctld slurmd slurmdbd mariadb munged; do
        alive "$DIR/run/$name.pid" || continue
        say "half up ($dead not running): stopping the rest, then starting it all"
        down
        break
    done
    mkdir -p "$DIR"/{log,run,state,spool}
    install_packages
    for tool in slurmctld slurmd slurmdbd munged mariadbd sinfo; do
        command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || die "$tool is not installed"
    done
    export SLURM_CONF="$DIR/slurm.conf"
    write_configs
    start_munge
    start_database
    slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
    sacctmgr -i add cluster lipt > /dev/null 2>&1 || true  # already there on a second `up`
    slurmctld -c  # no jobs left from an earlier `up`
    slurmd
    wait_for 30 "the node" sh -c 'sinfo -h -o %T | grep -qx idle'
    say "up: $(sinfo -h -o '%D node(s), %c CPUs each, partition %P')"
    echo "export SLURM_CONF=$DIR/slurm.conf"
}

down() {
    export SLURM_CONF="$DIR/slurm.conf"
    if alive "$DIR/run/slurmctld.pid"; then  # the cluster's jobs go first: their steps are
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true  # slurmd's children
        for _ in $(seq 1 50); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    local stopped=()
    for name in slurmd slurmctld slurmdbd mariadb munged; do
        local pidfile="$DIR/run/$name.pid"
        alive "$pidfile" || continue
        local pid; pid="$(cat "$pidfile")"
        kill "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        stopped+=("$name")
        rm -f "$pidfile"
    done
    say "down: stopped ${stopped[*]:-nothing (not running)}"
}

status() {
    export SLURM_CONF="$DIR/slurm.conf"
    for name in munged mariadb slurmdbd slurmctld slurmd; do
        if alive "$DIR/run/$name.pid"; then echo "$name: running ($(cat "$DIR/run/$name.pid"))"
        else echo "$name: stopped"; fi
    done
    alive "$DIR/run/slurmctld.pid" && sinfo
    return 0
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced (the tests): its functions only

case "$cmd" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: scripts/slurm.sh up|down|status [DIR]" >&2; exit 2 ;;
esac
