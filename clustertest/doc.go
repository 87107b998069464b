// Package clustertest runs the idempotency protocol against a multi-primary
// MariaDB Galera cluster: two instances of the example order service, each
// writing to its own node, under the races and failures a single server never
// shows. On Galera a conflict between nodes is settled by certification at
// COMMIT (the loser gets error 1213), a node's reads may lag the other
// nodes' commits, and a node can leave and rejoin while its peers keep
// serving.
//
// The package holds tests only. They run when IDEMPOTENCY_GALERA_DSNS lists
// the nodes' go-sql-driver DSNs, comma-separated, node 1 first; otherwise
// they skip, unless IDEMPOTENCY_REQUIRE_GALERA=1, in which case they fail.
// scripts/galera.sh starts a three-node cluster on 127.0.0.1 and prints the
// DSNs:
//
//	scripts/galera.sh start
//	IDEMPOTENCY_GALERA_DSNS="$(scripts/galera.sh dsns)" go test -v ./clustertest/
//	scripts/galera.sh stop
//
// The node-kill test kills and restarts node 2 through the same script (with
// the GALERA_DIR, GALERA_PORT and GALERA_SUSPECT_TIMEOUT of the
// environment), so it runs only against the cluster the script manages.
package clustertest
