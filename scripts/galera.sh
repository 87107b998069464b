#!/usr/bin/env bash
# Runs a three-node MariaDB Galera cluster on 127.0.0.1 for the cluster tests
# (clustertest/). Test use only: no passwords, loopback only, data thrown away.
#
#   scripts/galera.sh start       start the cluster (no-op if it runs; rejoins
#                                 missing nodes if some run), print the DSNs
#   scripts/galera.sh status      per node: port, cluster size, state, ready;
#                                 exits 1 unless all three are Synced
#   scripts/galera.sh stop        shut every node down and remove the state dir
#   scripts/galera.sh kill N      SIGKILL node N (1-3), as a crash would
#   scripts/galera.sh restart N   start node N again; it rejoins by IST (or
#                                 SST) and the script waits until it is Synced
#   scripts/galera.sh dsns        print the nodes' DSNs, comma-separated
#
# Environment:
#   GALERA_DIR      state directory (datadirs, sockets, logs). Defaults to
#                   ${TMPDIR:-/tmp}/orderguard-galera. stop removes it.
#   GALERA_PORT     SQL port of node 1; nodes 2 and 3 take the next two.
#                   Defaults to 4306. Node N's Galera ports derive from its
#                   SQL port P: group communication P+10000, IST P+10010,
#                   SST P+10020 (14306, 14316, 14326 for node 1).
#   GALERA_TIMEOUT  seconds to wait for the cluster or a node. Defaults to 60.
#   GALERA_SUSPECT_TIMEOUT
#                   seconds of silence after which the other nodes suspect a
#                   node and evict it (evs.suspect_timeout). Defaults to 10,
#                   twice Galera's default: on a loaded two-core machine a
#                   node can be starved for over 5 s, and with the default
#                   the cluster partitioned into three non-primary nodes
#                   during the tests. A killed node is evicted after this
#                   long, and the survivors stall their commits until then.
#
# Then run the cluster suite with the DSNs start prints:
#
#   IDEMPOTENCY_GALERA_DSNS="$(scripts/galera.sh dsns)" go test ./clustertest/
#
# The nodes are mariadbd processes of Debian's mariadb-server with the
# galera-4 provider and rsync SST; the script installs the packages if they
# are missing. Run as root, it runs mariadbd as user mysql (the rsync SST
# refuses to run as root); run as another user, it runs mariadbd as that user.
set -euo pipefail

dir="${GALERA_DIR:-${TMPDIR:-/tmp}/orderguard-galera}"
base_port="${GALERA_PORT:-4306}"
timeout="${GALERA_TIMEOUT:-60}"
suspect="${GALERA_SUSPECT_TIMEOUT:-10}"
nodes=(1 2 3)
marker=".orderguard-galera" # stop removes only a directory this script made

die() { echo "galera.sh: $*" >&2; exit 1; }
say() { echo "galera.sh: [${SECONDS}s] $*"; }

sql_port() { echo $((base_port + $1 - 1)); }
gcomm_port() { echo $(($(sql_port "$1") + 10000)); }
ist_port() { echo $(($(sql_port "$1") + 10010)); }
sst_port() { echo $(($(sql_port "$1") + 10020)); }
node_dir() { echo "$dir/node$1"; }
dsn() { echo "root@tcp(127.0.0.1:$(sql_port "$1"))/test"; }

dsns() {
  local out=() n
  for n in "${nodes[@]}"; do out+=("$(dsn "$n")"); done
  (IFS=,; echo "${out[*]}")
}

# Every client call names the node's port and reads no option file: the
# machine's my.cnf points the clients at the main server's socket.
client() {
  local n=$1; shift
  mariadb --no-defaults --protocol=TCP -h127.0.0.1 -P"$(sql_port "$n")" -uroot --connect-timeout=2 "$@"
}

# state N prints "cluster_size local_state_comment ready" of node N, or
# fails if the node does not answer.
state() {
  client "$1" -N -B -e "SELECT
    MAX(IF(VARIABLE_NAME = 'WSREP_CLUSTER_SIZE', VARIABLE_VALUE, NULL)),
    MAX(IF(VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT', VARIABLE_VALUE, NULL)),
    MAX(IF(VARIABLE_NAME = 'WSREP_READY', VARIABLE_VALUE, NULL))
    FROM information_schema.GLOBAL_STATUS" 2>/dev/null
}

# pid N prints node N's mariadbd pid if that process runs. The pid is
# checked against the process's command line (our defaults file), so a
# reused pid is never mistaken for a node.
pid() {
  local d p f
  d=$(node_dir "$1")
  for f in "$d/mariadbd.pid" "$d/launcher.pid"; do
    [[ -s "$f" ]] || continue
    p=$(<"$f")
    if [[ -r /proc/$p/cmdline ]] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF -- "--defaults-file=$d/my.cnf"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

running() { pid "$1" >/dev/null; }

find_provider() {
  local p
  for p in "${GALERA_PROVIDER:-}" /usr/lib/galera/libgalera_smm.so /usr/lib/libgalera_smm.so; do
    [[ -n "$p" && -f "$p" ]] && { echo "$p"; return 0; }
  done
  p=$(dpkg -L galera-4 2>/dev/null | grep '/libgalera_smm\.so$' | head -n1 || true)
  [[ -n "$p" && -f "$p" ]] && { echo "$p"; return 0; }
  return 1
}

find_mariadbd() {
  command -v mariadbd 2>/dev/null || { [[ -x /usr/sbin/mariadbd ]] && echo /usr/sbin/mariadbd; }
}

ensure_packages() {
  if find_mariadbd >/dev/null && find_provider >/dev/null && command -v rsync >/dev/null &&
    command -v mariadb-install-db >/dev/null && [[ -x /usr/bin/wsrep_sst_rsync ]]; then
    return 0
  fi
  [[ $EUID -eq 0 ]] || die "mariadb-server, galera-4 and rsync are needed; install them (as root: apt-get install -y mariadb-server galera-4 rsync)"
  say "installing mariadb-server galera-4 rsync"
  DEBIAN_FRONTEND=noninteractive apt-get install -y mariadb-server galera-4 rsync
}

run_user() { if [[ $EUID -eq 0 ]]; then echo mysql; else id -un; fi; }

write_config() {
  local n=$1 d provider cluster="" m
  d=$(node_dir "$n")
  provider=$(find_provider)
  for m in "${nodes[@]}"; do cluster+="${cluster:+,}127.0.0.1:$(gcomm_port "$m")"; done
  cat >"$d/my.cnf" <<EOF
[mysqld]
user = $(run_user)
datadir = $d/data
socket = $d/mysqld.sock
pid-file = $d/mariadbd.pid
log-error = $d/error.log
port = $(sql_port "$n")
bind-address = 127.0.0.1
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 500
performance_schema = OFF
default_storage_engine = InnoDB
innodb_buffer_pool_size = 64M
innodb_log_file_size = 16M
innodb_flush_log_at_trx_commit = 2
innodb_autoinc_lock_mode = 2
binlog_format = ROW

wsrep_on = ON
wsrep_provider = $provider
wsrep_cluster_name = orderguard-test
wsrep_cluster_address = gcomm://$cluster
wsrep_node_name = node$n
wsrep_node_address = 127.0.0.1:$(gcomm_port "$n")
wsrep_node_incoming_address = 127.0.0.1:$(sql_port "$n")
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$(sst_port "$n")
wsrep_provider_options = "base_host=127.0.0.1;base_port=$(gcomm_port "$n");gmcast.listen_addr=tcp://127.0.0.1:$(gcomm_port "$n");ist.recv_addr=127.0.0.1:$(ist_port "$n");gcache.size=32M;gcache.page_size=16M;evs.suspect_timeout=PT${suspect}S;evs.inactive_timeout=PT$((3 * suspect))S;evs.install_timeout=PT$((3 * suspect / 2))S"
EOF
}

check_ports_free() {
  local n p
  for n in "$@"; do
    for p in $(sql_port "$n") $(gcomm_port "$n") $(ist_port "$n") $(sst_port "$n"); do
      if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then
        die "port $p (node $n) is in use; set GALERA_PORT to move the cluster"
      fi
    done
  done
}

# init prepares a fresh state directory: each node's my.cnf, and node 1's
# datadir from mariadb-install-db (seed copies it to the others). The
# "normal" root authentication creates root@localhost, root@127.0.0.1 and
# root@::1 without a password, as the main test server has them (the
# default, "socket", would refuse root over TCP).
init() {
  local n u
  u=$(run_user)
  mkdir -p "$dir"
  touch "$dir/$marker"
  for n in "${nodes[@]}"; do
    mkdir -p "$(node_dir "$n")/data"
    write_config "$n"
  done
  chmod 755 "$dir"
  chown -R "$u" "$dir"
  if ! mariadb-install-db --defaults-file="$(node_dir 1)/my.cnf" --user="$u" \
    --auth-root-authentication-method=normal --skip-test-db \
    >"$dir/install-db.log" 2>&1; then
    cat "$dir/install-db.log" >&2
    die "mariadb-install-db failed"
  fi
}

# launch N [mariadbd options] starts node N in the background, detached from
# the caller: its own session, no inherited stdin or stdout (a caller
# reading our output, such as a Go test, would otherwise wait for mariadbd).
launch() {
  local n=$1 d mariadbd
  shift
  d=$(node_dir "$n")
  mariadbd=$(find_mariadbd)
  rm -f "$d/mariadbd.pid"
  setsid "$mariadbd" --defaults-file="$d/my.cnf" "$@" </dev/null >>"$d/stdout.log" 2>&1 &
  echo $! >"$d/launcher.pid"
  # Until the child has exec'd mariadbd, pid cannot recognise it.
  local launched=$! i
  for i in $(seq 100); do
    if running "$n" || ! kill -0 "$launched" 2>/dev/null; then break; fi
    sleep 0.05
  done
}

# recovered_position N prints node N's last committed position
# (uuid:seqno) from its InnoDB data, as galera_recovery does for systemd: a
# node killed with SIGKILL left seqno -1 in grastate.dat, and without the
# position it would rejoin by full SST instead of IST.
recovered_position() {
  local d pos
  d=$(node_dir "$1")
  "$(find_mariadbd)" --defaults-file="$d/my.cnf" --wsrep-recover --log-error="$d/recover.log" \
    </dev/null >/dev/null 2>&1 || true
  pos=$(sed -n 's/.*WSREP: Recovered position: *\([0-9a-f-]*:-\{0,1\}[0-9]*\).*/\1/p' "$d/recover.log" 2>/dev/null | tail -n1)
  rm -f "$d/recover.log"
  [[ -n "$pos" && "$pos" != *":-1" ]] && echo "$pos"
}

print_logs() {
  local n
  for n in "$@"; do
    echo "---- node $n: $(node_dir "$n")/error.log (last 40 lines) ----" >&2
    tail -n 40 "$(node_dir "$n")/error.log" >&2 2>/dev/null || echo "(no log)" >&2
  done
}

# wait_synced SIZE NODE... waits until each node is Synced, ready and sees
# SIZE members, printing progress; on timeout it prints the nodes' logs.
wait_synced() {
  local size=$1 n s c st rd ok line deadline=$((SECONDS + timeout)) last=""
  shift
  while :; do
    ok=1 line=""
    for n in "$@"; do
      if ! running "$n"; then
        say "node $n exited during startup"
        print_logs "$n"
        return 1
      fi
      s=$(state "$n" || true)
      line+=" node$n=[${s:-starting}]"
      read -r c st rd <<<"${s:-0 - -}"
      [[ "$c" == "$size" && "$st" == Synced && "$rd" == ON ]] || ok=0
    done
    if [[ "$line" != "$last" ]]; then
      say "waiting:$(tr '\t' ' ' <<<"$line")"
      last=$line
    fi
    ((ok)) && return 0
    if ((SECONDS >= deadline)); then
      say "timed out after ${timeout}s waiting for nodes $* (cluster size $size, Synced, ready)"
      print_logs "$@"
      return 1
    fi
    sleep 0.5
  done
}

# wait_evicted NODE... waits until the running nodes see a cluster of
# just themselves.
wait_evicted() {
  local deadline=$((SECONDS + timeout)) n c said=""
  while :; do
    local ok=1
    for n in "$@"; do
      read -r c _ <<<"$(state "$n" || echo 0)"
      [[ "$c" == "$#" ]] || ok=0
    done
    ((ok)) && return 0
    ((SECONDS < deadline)) || return 1
    [[ -n "$said" ]] || { say "waiting for nodes $* to evict the stopped node"; said=1; }
    sleep 0.5
  done
}

status() {
  local n s c st rd synced=0
  printf '%-6s %-6s %-13s %-15s %s\n' node port cluster_size state ready
  for n in "${nodes[@]}"; do
    if ! running "$n"; then
      printf '%-6s %-6s %-13s %-15s %s\n' "$n" "$(sql_port "$n")" - down -
      continue
    fi
    s=$(state "$n" || true)
    read -r c st rd <<<"${s:-- starting -}"
    printf '%-6s %-6s %-13s %-15s %s\n' "$n" "$(sql_port "$n")" "$c" "$st" "$rd"
    [[ "$st" == Synced ]] && synced=$((synced + 1))
  done
  ((synced == ${#nodes[@]}))
}

print_dsns() {
  local n
  say "DSNs:"
  for n in "${nodes[@]}"; do echo "  node $n: $(dsn "$n")"; done
  echo "  IDEMPOTENCY_GALERA_DSNS=\"$(dsns)\""
}

running_nodes() {
  local n
  for n in "${nodes[@]}"; do running "$n" && echo "$n"; done
  return 0
}

# seed gives nodes 2 and 3 node 1's state, so that they join by an IST of
# the few events since instead of a full SST: node 1 bootstraps a cluster
# of one, creates database test, shuts down cleanly (grastate.dat then
# holds the cluster's uuid and seqno), and its datadir is copied, as an
# rsync SST would copy it. Two SSTs (a donor serves one joiner at a time)
# made the start 4 to 6 s slower.
seed() {
  local n d1
  d1=$(node_dir 1)/data
  say "seeding: bootstrapping node 1 alone"
  launch 1 --wsrep-new-cluster
  wait_synced 1 1 || die "node 1 did not bootstrap"
  client 1 -e "CREATE DATABASE IF NOT EXISTS test"
  shutdown_nodes 1
  grep -q '^seqno: *[0-9]' "$d1/grastate.dat" || die "node 1 did not save its position: $(cat "$d1/grastate.dat")"
  for n in 2 3; do
    rm -rf "$(node_dir "$n")/data"
    cp -a "$d1" "$(node_dir "$n")/data"
    rm -f "$(node_dir "$n")/data/gvwstate.dat" "$(node_dir "$n")/data/galera.cache"
  done
}

# shutdown_nodes N... shuts the nodes down cleanly, and kills any that has
# not exited after 30 s.
shutdown_nodes() {
  local n p pids=() deadline
  for n in "$@"; do
    if p=$(pid "$n"); then
      pids+=("$p")
      mariadb-admin --no-defaults --protocol=TCP -h127.0.0.1 -P"$(sql_port "$n")" -uroot \
        --connect-timeout=2 --shutdown-timeout=20 shutdown >/dev/null 2>&1 &
    fi
  done
  deadline=$((SECONDS + 30))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      say "pid $p did not shut down in time: SIGKILL"
      kill -KILL "$p" 2>/dev/null || true
      while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
    fi
  done
  wait
}

start() {
  local t0=$SECONDS up missing=() n
  mapfile -t up < <(running_nodes)
  if ((${#up[@]} == ${#nodes[@]})); then
    say "cluster already running in $dir"
    status || true
    print_dsns
    return 0
  fi
  if ((${#up[@]} > 0)); then
    for n in "${nodes[@]}"; do running "$n" || missing+=("$n"); done
    say "nodes ${up[*]} run; restarting ${missing[*]}"
    for n in "${missing[@]}"; do restart "$n"; done
    status || true
    print_dsns
    return 0
  fi
  ensure_packages
  check_ports_free "${nodes[@]}"
  if [[ -e "$dir" ]]; then
    [[ -f "$dir/$marker" ]] || die "$dir exists and was not made by this script; set GALERA_DIR"
    say "no node runs: discarding the old state in $dir"
    rm -rf "$dir"
  fi
  say "initialising $dir"
  init
  seed
  say "bootstrapping node 1 (port $(sql_port 1))"
  launch 1 --wsrep-new-cluster
  wait_synced 1 1 || die "node 1 did not bootstrap"
  # One at a time: two nodes joining at once take seconds longer to agree
  # on the view than two joining in turn.
  for n in 2 3; do
    say "starting node $n (port $(sql_port "$n"))"
    launch "$n"
    wait_synced "$n" 1 "$n" || die "node $n did not join"
  done
  wait_synced 3 "${nodes[@]}" || die "the cluster did not form"
  say "cluster up in $((SECONDS - t0))s"
  status || true
  print_dsns
}

restart() {
  local n=$1 pos others=() m
  valid_node "$n"
  [[ -f "$(node_dir "$n")/my.cnf" ]] || die "no cluster state in $dir; run start"
  if running "$n"; then
    say "node $n already runs"
    return 0
  fi
  for m in "${nodes[@]}"; do [[ $m == "$n" ]] || ! running "$m" || others+=("$m"); done
  ((${#others[@]} > 0)) || die "no other node runs: node $n cannot rejoin (run stop, then start)"
  # A node that rejoins while the others still count its killed
  # incarnation as a member waits for that one to be evicted, and then for
  # view install timeouts: about 15 s instead of 3. Wait for the eviction
  # (evs.suspect_timeout, GALERA_SUSPECT_TIMEOUT) first.
  local t0=$SECONDS
  wait_evicted "${others[@]}" || die "the other nodes still count node $n as a member"
  pos=$(recovered_position "$n" || true)
  if [[ -n "$pos" ]]; then
    say "restarting node $n from position $pos (IST if the donor's gcache holds the gap)"
    launch "$n" --wsrep-start-position="$pos"
  else
    say "restarting node $n (position unknown: full SST)"
    launch "$n"
  fi
  wait_synced $((${#others[@]} + 1)) "$n" || die "node $n did not rejoin"
  say "node $n Synced in $((SECONDS - t0))s"
}

kill_node() {
  local n=$1 p
  valid_node "$n"
  p=$(pid "$n") || die "node $n is not running"
  kill -KILL "$p"
  while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  say "node $n (pid $p) killed"
}

stop() {
  shutdown_nodes "${nodes[@]}"
  if [[ -e "$dir" ]]; then
    [[ -f "$dir/$marker" ]] || die "$dir was not made by this script; not removing it"
    rm -rf "$dir"
  fi
  say "stopped; removed $dir"
}

valid_node() { [[ "$1" =~ ^[1-3]$ ]] || die "node must be 1, 2 or 3, not '$1'"; }

case "${1:-}" in
  start) start ;;
  status) status ;;
  stop) stop ;;
  kill) kill_node "${2:-}" ;;
  restart) restart "${2:-}" ;;
  dsns) dsns ;;
  *)
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2
    exit 2
    ;;
esac
