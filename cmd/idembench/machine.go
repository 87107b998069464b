package main

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Machine describes where the numbers were measured.
type Machine struct {
	Date         string            `json:"date"`
	Nproc        string            `json:"nproc"`
	CPUModel     string            `json:"cpu_model"`
	MemTotal     string            `json:"mem_total"`
	Kernel       string            `json:"kernel"`
	GoVersion    string            `json:"go_version"`
	GoBuiltWith  string            `json:"go_built_with"`
	MariaDB      string            `json:"mariadb_version"`
	MariaDBVars  map[string]string `json:"mariadb_settings"`
	Redis        string            `json:"redis_version,omitempty"`
	Postgres     string            `json:"postgres_version,omitempty"`
	PostgresVars map[string]string `json:"postgres_settings,omitempty"`
	SQLiteDriver string            `json:"sqlite_driver"`
}

func describeMachine(ctx context.Context, dsn, redisAddr string) Machine {
	m := Machine{
		Date:         time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		GoBuiltWith:  runtime.Version(),
		SQLiteDriver: "modernc.org/sqlite (pure Go, see the root go.mod for the version)",
		MariaDBVars:  map[string]string{},
	}
	m.Nproc = cmdOut("nproc")
	if m.Nproc == "" {
		m.Nproc = itoa(runtime.NumCPU())
	}
	m.GoVersion = cmdOut("go", "version")
	m.Kernel = cmdOut("uname", "-sr")
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		m.MemTotal = strings.Join(strings.Fields(strings.TrimPrefix(line, "MemTotal:")), " ")
	}
	if cfg, err := mysql.ParseDSN(dsn); err == nil {
		if db, err := sql.Open("mysql", cfg.FormatDSN()); err == nil {
			defer db.Close()
			_ = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&m.MariaDB)
			m.MariaDBVars = queryPairs(ctx, db, `SHOW GLOBAL VARIABLES WHERE Variable_name IN
('innodb_buffer_pool_size','innodb_flush_log_at_trx_commit','sync_binlog','log_bin','innodb_log_file_size','innodb_change_buffering')`)
		}
	}
	if st, err := openRedis(redisAddr); err == nil {
		if info, err := st.Conn().Info(ctx, "server").Result(); err == nil {
			for _, line := range strings.Split(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
					m.Redis = v
				}
			}
		}
		_ = st.Close()
	}
	return m
}

// queryPairs is the (name, value) rows of query on db; those it could not
// read are left out.
func queryPairs(ctx context.Context, db *sql.DB, query string) map[string]string {
	out := map[string]string{}
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if rows.Scan(&k, &v) == nil {
			out[k] = v
		}
	}
	return out
}

func cmdOut(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
