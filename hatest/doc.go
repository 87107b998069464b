// Package hatest runs the example order service against a PostgreSQL
// high-availability cluster, three nodes managed by Patroni in synchronous
// mode, and makes the leader fail under load: three instances of the
// service writing through HAProxy (which routes to whichever node Patroni's
// REST API reports as the primary) while the leader is killed, and the same
// through a multi-host URL with target_session_attrs=read-write, the way
// without a proxy, for a kill and for a planned switchover. Each run checks
// that no acknowledged order is lost, that no key gets two orders, that the
// gap answers only 503 or 409 with Retry-After (never 500), and that every
// request returns within a bound; and it reports the time without a
// primary, the time to the first write and the answers by status. One more
// test freezes the moment when every node a multi-host URL lists is a
// standby.
//
// The package holds tests only. They run when IDEMPOTENCY_PATRONI_URL is
// the pgx URL of the cluster through HAProxy; otherwise they skip, unless
// IDEMPOTENCY_REQUIRE_PATRONI=1, in which case they fail.
// scripts/patroni.sh starts the cluster on 127.0.0.1 and prints the URL:
//
//	scripts/patroni.sh start
//	IDEMPOTENCY_PATRONI_URL="$(scripts/patroni.sh url)" go test -v ./hatest/
//	scripts/patroni.sh stop
//
// The tests kill nodes through the same script (with the PATRONI_DIR and
// PATRONI_PORT of the environment), so they run only against the cluster
// the script manages. Each test begins with the script's start, which
// brings back a node an earlier test killed (it rejoins as a replica, by
// pg_rewind or a fresh copy) and waits until the cluster is whole; the
// node the last test killed stays down until stop. See
// docs/postgres-ha.md.
//
// It is a module of its own, like crosstransport, so that the root module
// and the postgres module carry no test that needs a cluster.
package hatest
