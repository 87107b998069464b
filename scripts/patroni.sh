#!/usr/bin/env bash
# Runs a PostgreSQL high-availability cluster on 127.0.0.1 for the failover
# tests (hatest/): etcd, three PostgreSQL 15 nodes managed by Patroni in
# synchronous mode, and HAProxy in front, routing to whichever node Patroni's
# REST API reports as the primary. Test use only: no passwords (trust on
# loopback), data thrown away.
#
#   scripts/patroni.sh start      start the cluster (no-op if it runs; starts
#                                 whatever part is missing, so a killed node
#                                 rejoins), wait until a primary takes
#                                 writes through HAProxy and both standbys
#                                 run, one of them synchronous; print the
#                                 URLs
#   scripts/patroni.sh status     per node: ports, role, state, timeline, lag;
#                                 exits 1 unless one leader, a sync standby
#                                 and three running nodes
#   scripts/patroni.sh stop       stop everything and remove the state dir
#   scripts/patroni.sh url        the pgx URL through HAProxy (the primary)
#   scripts/patroni.sh urls       the multi-host pgx URL listing the three
#                                 nodes, target_session_attrs=read-write: the
#                                 way without a proxy
#   scripts/patroni.sh apis       the nodes' Patroni REST API URLs,
#                                 comma-separated, node 1 first
#   scripts/patroni.sh leader     the number (1-3) of the node that leads
#   scripts/patroni.sh kill N     SIGKILL node N's Patroni and its postmaster
#                                 together, as a crash of its machine would
#                                 (killing the postmaster alone, Patroni
#                                 would restart it in place: no failover)
#   scripts/patroni.sh restart N  start node N's Patroni again; it rejoins as
#                                 a replica (pg_rewind, or a fresh copy) and
#                                 the script waits until it streams
#
# Environment:
#   PATRONI_DIR      state directory (datadirs, configs, logs). Defaults to
#                    ${TMPDIR:-/tmp}/orderguard-patroni. stop removes it.
#   PATRONI_PORT     HAProxy's port. Defaults to 5440. Node N's PostgreSQL
#                    listens on PATRONI_PORT+N (5441-5443), its Patroni REST
#                    API on PATRONI_PORT+3000+N (8441-8443); etcd's client
#                    and peer ports are PATRONI_PORT+20000 and +20001.
#   PATRONI_TTL, PATRONI_LOOP_WAIT, PATRONI_RETRY_TIMEOUT
#                    Patroni's leader lease, loop period and DCS/PostgreSQL
#                    retry budget in seconds. Default 6, 1 and 2 (Patroni's
#                    are 30, 10 and 10): a dead leader's lease expires within
#                    6 s, and the replicas see it within a second. Patroni
#                    needs loop_wait + 2 * retry_timeout <= ttl.
#   PATRONI_TIMEOUT  seconds to wait for the cluster or a node. Defaults to 90.
#
# Then run the failover suite with the URL url prints (the suite asks the
# script for urls and apis, and kills nodes through it):
#
#   IDEMPOTENCY_PATRONI_URL="$(scripts/patroni.sh url)" go test -v ./hatest/
#
# The nodes run Debian's patroni, etcd-server and haproxy and PostgreSQL
# 15's binaries (/usr/lib/postgresql/15/bin, PG_BINDIR to change); the
# script installs the packages if they are missing. PostgreSQL refuses to
# run as root: run as root, the script runs everything as user postgres;
# run as another user, as that user.
set -euo pipefail

dir="${PATRONI_DIR:-${TMPDIR:-/tmp}/orderguard-patroni}"
base_port="${PATRONI_PORT:-5440}"
ttl="${PATRONI_TTL:-6}"
loop_wait="${PATRONI_LOOP_WAIT:-1}"
retry_timeout="${PATRONI_RETRY_TIMEOUT:-2}"
timeout="${PATRONI_TIMEOUT:-90}"
bindir="${PG_BINDIR:-/usr/lib/postgresql/15/bin}"
nodes=(1 2 3)
marker=".orderguard-patroni" # stop removes only a directory this script made
scope="orderguard-test"

die() { echo "patroni.sh: $*" >&2; exit 1; }
say() { echo "patroni.sh: [${SECONDS}s] $*"; }

haproxy_port() { echo "$base_port"; }
pg_port() { echo $((base_port + $1)); }
api_port() { echo $((base_port + 3000 + $1)); }
etcd_port() { echo $((base_port + 20000)); }
etcd_peer_port() { echo $((base_port + 20001)); }
node_dir() { echo "$dir/node$1"; }
api() { echo "http://127.0.0.1:$(api_port "$1")"; }

url() { echo "postgres://postgres@127.0.0.1:$(haproxy_port)/postgres?sslmode=disable"; }

urls() {
  local hosts="" n
  for n in "${nodes[@]}"; do hosts+="${hosts:+,}127.0.0.1:$(pg_port "$n")"; done
  echo "postgres://postgres@$hosts/postgres?sslmode=disable&target_session_attrs=read-write"
}

apis() {
  local out=() n
  for n in "${nodes[@]}"; do out+=("$(api "$n")"); done
  (IFS=,; echo "${out[*]}")
}

run_user() { if [[ $EUID -eq 0 ]]; then echo postgres; else id -un; fi; }

# as CMD... runs CMD as run_user, replacing this process (no runuser
# parent in between, so that $! of a background `as` is CMD's pid).
as() {
  if [[ $EUID -eq 0 ]]; then
    exec setpriv --reuid=postgres --regid=postgres --init-groups --reset-env -- "$@"
  fi
  exec "$@"
}

# pid_of FILE PATTERN prints the pid in FILE if that process runs and its
# command line contains PATTERN, so that a reused pid is never mistaken
# for ours.
pid_of() {
  local f=$1 pattern=$2 p
  [[ -s "$f" ]] || return 1
  p=$(head -n1 "$f")
  [[ "$p" =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$p/cmdline ]] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF -- "$pattern" || return 1
  echo "$p"
}

# alive PID reports whether the process runs: a killed process whose
# parent has not reaped it yet (a zombie) has already closed its sockets
# and counts as dead.
alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ "${st%% *}" != Z ]]
}

etcd_pid() { pid_of "$dir/etcd.pid" "--data-dir=$dir/etcd"; }
haproxy_pid() { pid_of "$dir/haproxy.pid" "$dir/haproxy.cfg"; }
patroni_pid() { pid_of "$(node_dir "$1")/patroni.pid" "$(node_dir "$1")/patroni.yml"; }
postmaster_pid() { pid_of "$(node_dir "$1")/data/postmaster.pid" "$(node_dir "$1")/data"; }

find_haproxy() {
  command -v haproxy 2>/dev/null || { [[ -x /usr/sbin/haproxy ]] && echo /usr/sbin/haproxy; }
}

ensure_packages() {
  local need=()
  command -v patroni >/dev/null || need+=(patroni)
  command -v etcd >/dev/null || need+=(etcd-server)
  find_haproxy >/dev/null || need+=(haproxy)
  [[ -x "$bindir/postgres" ]] || need+=(postgresql-15)
  ((${#need[@]} == 0)) && return 0
  [[ $EUID -eq 0 ]] || die "${need[*]} needed; install them (as root: apt-get install -y ${need[*]})"
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
}

check_ports_free() {
  local p
  for p in "$@"; do
    if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then
      die "port $p is in use; set PATRONI_PORT to move the cluster"
    fi
  done
}

all_ports() {
  local n
  echo "$(haproxy_port) $(etcd_port) $(etcd_peer_port)"
  for n in "${nodes[@]}"; do echo "$(pg_port "$n") $(api_port "$n")"; done
}

write_patroni_config() {
  local n=$1 d
  d=$(node_dir "$n")
  # synchronous_mode: a commit returns only once a standby has the WAL,
  # and Patroni promotes only that standby, so no acknowledged order is
  # lost by a failover (docs/postgres-ha.md). maximum_lag_on_failover
  # bounds what an asynchronous failover could lose, were it switched off.
  cat >"$d/patroni.yml" <<EOF
scope: $scope
namespace: /orderguard/
name: node$n
restapi:
  listen: 127.0.0.1:$(api_port "$n")
  connect_address: 127.0.0.1:$(api_port "$n")
etcd3:
  host: 127.0.0.1:$(etcd_port)
bootstrap:
  dcs:
    ttl: $ttl
    loop_wait: $loop_wait
    retry_timeout: $retry_timeout
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 200
        max_wal_senders: 10
        max_replication_slots: 10
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        wal_keep_size: 128MB
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
postgresql:
  listen: 127.0.0.1:$(pg_port "$n")
  connect_address: 127.0.0.1:$(pg_port "$n")
  data_dir: $d/data
  bin_dir: $bindir
  pgpass: $d/pgpass
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  basebackup:
    - checkpoint: fast
  parameters:
    unix_socket_directories: $d
    shared_buffers: 32MB
    logging_collector: "off"
    log_line_prefix: "%m [%p] node$n "
EOF
}

# haproxy.cfg: one frontend on the primary. Patroni's REST API answers
# GET /primary 200 on the leader only; a check every 500 ms (fall 2) marks
# a dead or demoted leader down within a second and the promoted one up at
# its first check, and shutdown-sessions cuts the connections to a node
# marked down, so that clients reconnect to the new primary instead of
# waiting on a half-dead one. retries 0: a connection the dead leader
# refuses before its check fails is closed at once (the client's pool
# answers 503 and the client retries) rather than retried by HAProxy
# after its one-second turn-around, which held requests for 3 s.
write_haproxy_config() {
  local n
  {
    cat <<EOF
global
  maxconn 1000
  log stderr format raw local0 notice

defaults
  mode tcp
  log global
  retries 0
  timeout connect 2s
  timeout client 30m
  timeout server 30m
  timeout check 1s

listen primary
  bind 127.0.0.1:$(haproxy_port)
  option httpchk GET /primary
  http-check expect status 200
  default-server inter 500ms fastinter 250ms downinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
EOF
    for n in "${nodes[@]}"; do
      echo "  server node$n 127.0.0.1:$(pg_port "$n") maxconn 300 check port $(api_port "$n")"
    done
  } >"$dir/haproxy.cfg"
}

init() {
  local n
  mkdir -p "$dir/etcd"
  touch "$dir/$marker"
  for n in "${nodes[@]}"; do
    mkdir -p "$(node_dir "$n")"
    write_patroni_config "$n"
  done
  write_haproxy_config
  chmod 755 "$dir"
  chmod 700 "$dir/etcd"
  [[ $EUID -ne 0 ]] || chown -R postgres:postgres "$dir"
}

# launch PIDFILE LOG CMD... starts CMD in the background, detached from the
# caller: its own session, no inherited stdin or stdout (a caller reading
# our output, such as a Go test, would otherwise wait for it).
launch() {
  local pidfile=$1 log=$2
  shift 2
  (as setsid "$@" </dev/null >>"$log" 2>&1) &
  echo $! >"$pidfile"
}

start_etcd() {
  etcd_pid >/dev/null && return 0
  say "starting etcd (client port $(etcd_port))"
  launch "$dir/etcd.pid" "$dir/etcd.log" "$(command -v etcd)" --name=etcd1 --data-dir="$dir/etcd" \
    --listen-client-urls="http://127.0.0.1:$(etcd_port)" \
    --advertise-client-urls="http://127.0.0.1:$(etcd_port)" \
    --listen-peer-urls="http://127.0.0.1:$(etcd_peer_port)" \
    --initial-advertise-peer-urls="http://127.0.0.1:$(etcd_peer_port)" \
    --initial-cluster="etcd1=http://127.0.0.1:$(etcd_peer_port)" \
    --initial-cluster-state=new --initial-cluster-token="$scope" \
    --listen-metrics-urls="" --log-level=warn
  local deadline=$((SECONDS + timeout))
  until curl -fsS -m 1 "http://127.0.0.1:$(etcd_port)/health" 2>/dev/null | grep -q '"health":"true"'; do
    etcd_pid >/dev/null || { tail -n 30 "$dir/etcd.log" >&2; die "etcd exited"; }
    ((SECONDS < deadline)) || { tail -n 30 "$dir/etcd.log" >&2; die "etcd not healthy after ${timeout}s"; }
    sleep 0.1
  done
}

start_haproxy() {
  haproxy_pid >/dev/null && return 0
  say "starting HAProxy (port $(haproxy_port))"
  launch "$dir/haproxy.pid" "$dir/haproxy.log" "$(find_haproxy)" -db -f "$dir/haproxy.cfg"
}

start_patroni() {
  local n=$1 d
  patroni_pid "$n" >/dev/null && return 0
  d=$(node_dir "$n")
  say "starting node $n (PostgreSQL $(pg_port "$n"), REST $(api_port "$n"))"
  launch "$d/patroni.pid" "$d/patroni.log" "$(command -v patroni)" "$d/patroni.yml"
}

# members prints one line per member Patroni's REST API reports: name role
# state timeline lag. It asks the nodes in turn until one answers.
members() {
  local n out
  for n in "${nodes[@]}"; do
    if out=$(curl -fsS -m 1 "$(api "$n")/cluster" 2>/dev/null); then
      jq -r '.members[] | "\(.name) \(.role) \(.state) \(.timeline // "-") \(.lag // 0)"' <<<"$out"
      return 0
    fi
  done
  return 1
}

leader() {
  local name role _
  while read -r name role _; do
    [[ "$role" == leader ]] && { echo "${name#node}"; return 0; }
  done < <(members || true)
  return 1
}

# healthy: every node's Patroni answers that its PostgreSQL runs (the
# members' entries in etcd outlive a killed node by up to the TTL), the
# members are one running leader, a running sync standby and a running
# replica, and a write through HAProxy succeeds.
healthy() {
  local m running=0 leaders=0 syncs=0 name role state n _
  for n in "${nodes[@]}"; do
    curl -fsS -m 1 -o /dev/null "$(api "$n")/health" 2>/dev/null || return 1
  done
  m=$(members) || return 1
  while read -r name role state _; do
    [[ "$state" == running || "$state" == streaming ]] || continue
    running=$((running + 1))
    [[ "$role" == leader ]] && leaders=$((leaders + 1))
    [[ "$role" == sync_standby ]] && syncs=$((syncs + 1))
  done <<<"$m"
  ((running == ${#nodes[@]} && leaders == 1 && syncs == 1)) || return 1
  [[ "$(psql "$(url)&connect_timeout=2" -XAtqc 'SELECT NOT pg_is_in_recovery()' 2>/dev/null)" == t ]]
}

print_logs() {
  local n
  for n in "${nodes[@]}"; do
    echo "---- node $n: $(node_dir "$n")/patroni.log (last 30 lines) ----" >&2
    tail -n 30 "$(node_dir "$n")/patroni.log" >&2 2>/dev/null || echo "(no log)" >&2
  done
}

wait_healthy() {
  local deadline=$((SECONDS + timeout)) line last=""
  while ! healthy; do
    line=$(members 2>/dev/null | tr '\n' ';' || true)
    if [[ "$line" != "$last" ]]; then
      say "waiting: ${line:-no member answers yet}"
      last=$line
    fi
    if ((SECONDS >= deadline)); then
      say "timed out after ${timeout}s waiting for a leader, a sync standby and three running nodes"
      print_logs
      return 1
    fi
    sleep 0.25
  done
}

status() {
  local n name role state tl lag ok=0
  printf '%-6s %-6s %-6s %-14s %-9s %-3s %s\n' node pg rest role state tl lag
  declare -A r s t l
  while read -r name role state tl lag; do
    r[$name]=$role s[$name]=$state t[$name]=$tl l[$name]=$lag
  done < <(members || true)
  for n in "${nodes[@]}"; do
    printf '%-6s %-6s %-6s %-14s %-9s %-3s %s\n' "$n" "$(pg_port "$n")" "$(api_port "$n")" \
      "${r[node$n]:--}" "${s[node$n]:-down}" "${t[node$n]:--}" "${l[node$n]:--}"
  done
  healthy || ok=1
  return $ok
}

print_urls() {
  say "URLs:"
  echo "  through HAProxy:  IDEMPOTENCY_PATRONI_URL=\"$(url)\""
  echo "  without a proxy:  $(urls)"
  echo "  Patroni REST:     $(apis)"
}

some_part_runs() {
  local n
  etcd_pid >/dev/null || haproxy_pid >/dev/null && return 0
  for n in "${nodes[@]}"; do
    patroni_pid "$n" >/dev/null || postmaster_pid "$n" >/dev/null && return 0
  done
  return 1
}

start() {
  local t0=$SECONDS n
  if some_part_runs; then
    start_etcd
    for n in "${nodes[@]}"; do
      patroni_pid "$n" >/dev/null || rejoin "$n"
    done
    start_haproxy
    wait_healthy || die "the cluster is not healthy"
    say "cluster runs in $dir"
    status || true
    print_urls
    return 0
  fi
  ensure_packages
  # shellcheck disable=SC2046
  check_ports_free $(all_ports)
  if [[ -e "$dir" ]]; then
    [[ -f "$dir/$marker" ]] || die "$dir exists and was not made by this script; set PATRONI_DIR"
    say "nothing runs: discarding the old state in $dir"
    rm -rf "$dir"
  fi
  say "initialising $dir (as user $(run_user))"
  init
  start_etcd
  # All three at once: one wins the initialize key and runs initdb, the
  # others wait for it and copy it with pg_basebackup.
  for n in "${nodes[@]}"; do start_patroni "$n"; done
  start_haproxy
  wait_healthy || die "the cluster did not form"
  say "cluster up in $((SECONDS - t0))s"
  status || true
  print_urls
}

# stop_pids SIGNAL SECONDS PID... sends SIGNAL and waits up to SECONDS for
# the processes to exit, then SIGKILLs the rest.
stop_pids() {
  local sig=$1 wait=$2 p deadline
  shift 2
  (($# > 0)) || return 0
  kill "-$sig" "$@" 2>/dev/null || true
  deadline=$((SECONDS + wait))
  for p in "$@"; do
    while alive "$p" && ((SECONDS < deadline)); do sleep 0.05; done
    if alive "$p"; then
      say "pid $p did not exit in time: SIGKILL"
      kill -KILL "$p" 2>/dev/null || true
      while alive "$p"; do sleep 0.05; done
    fi
  done
}

stop() {
  local n p pids=()
  p=$(haproxy_pid) && stop_pids TERM 5 "$p"
  # The data is thrown away, so nothing needs a clean shutdown: Patroni
  # stopping its PostgreSQL took 8 s (a leader in synchronous mode waits
  # for its standbys), an immediate shutdown (SIGQUIT) takes moments.
  # Patroni goes first, so that none restarts its PostgreSQL.
  for n in "${nodes[@]}"; do p=$(patroni_pid "$n") && pids+=("$p"); done
  stop_pids KILL 5 "${pids[@]}"
  pids=()
  for n in "${nodes[@]}"; do p=$(postmaster_pid "$n") && pids+=("$p"); done
  stop_pids QUIT 10 "${pids[@]}"
  p=$(etcd_pid) && stop_pids TERM 5 "$p"
  if [[ -e "$dir" ]]; then
    [[ -f "$dir/$marker" ]] || die "$dir was not made by this script; not removing it"
    rm -rf "$dir"
  fi
  say "stopped; removed $dir"
}

kill_node() {
  local n=$1 p pm=""
  valid_node "$n"
  pm=$(postmaster_pid "$n" || true)
  p=$(patroni_pid "$n") || die "node $n's Patroni is not running"
  # Patroni first, in the same call: a Patroni that outlived its
  # postmaster by a loop would restart it.
  kill -KILL "$p" $pm 2>/dev/null || true
  while alive "$p" || { [[ -n "$pm" ]] && alive "$pm"; }; do sleep 0.01; done
  say "node $n killed (Patroni pid $p, postmaster pid ${pm:-none})"
}

restart() {
  local n=$1 t0=$SECONDS
  valid_node "$n"
  [[ -f "$(node_dir "$n")/patroni.yml" ]] || die "no cluster state in $dir; run start"
  if patroni_pid "$n" >/dev/null; then
    say "node $n already runs"
    return 0
  fi
  rejoin "$n"
  wait_healthy || die "node $n did not rejoin"
  say "node $n rejoined in $((SECONDS - t0))s"
}

# rejoin N starts node N's Patroni, which brings its PostgreSQL back as a
# replica of the leader. A postmaster that outlived its Patroni would keep
# the port and the data directory: it is ended first.
rejoin() {
  local pm
  pm=$(postmaster_pid "$1" || true)
  [[ -z "$pm" ]] || stop_pids KILL 5 "$pm"
  start_patroni "$1"
}

valid_node() { [[ "$1" =~ ^[1-3]$ ]] || die "node must be 1, 2 or 3, not '$1'"; }

case "${1:-}" in
  start) start ;;
  status) status ;;
  stop) stop ;;
  url) url ;;
  urls) urls ;;
  apis) apis ;;
  leader) leader || die "no leader" ;;
  kill) kill_node "${2:-}" ;;
  restart) restart "${2:-}" ;;
  *)
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2
    exit 2
    ;;
esac
