package main

// Probes read what says where a request's time goes: the server's counters
// and the CPU of this process and of the database's, before and after a
// window (perRequest turns the two readings into a point's columns).

import (
	"context"
	"database/sql"
	"maps"
	"os"
	"strconv"
	"strings"
	"time"
)

// mariaProbe reads what says where a request's time goes: this process's
// round trips to the database (counted client-side), the server's counters
// (statements, fsyncs, buffer-pool misses, row-lock waits: global, so
// anything else running on the server adds to them), and the CPU time of
// this process and of mariadbd.
func mariaProbe(admin *sql.DB, counts *sqlCounts) func() map[string]float64 {
	vars := map[string]string{
		"Questions":                "server_stmts",
		"Com_commit":               "commits",
		"Innodb_data_fsyncs":       "fsyncs",
		"Innodb_buffer_pool_reads": "bp_disk_reads",
		"Innodb_row_lock_waits":    "row_lock_waits",
	}
	cpu := cpuProbe(map[string]string{"cpu_db": "mariadbd"})
	return func() map[string]float64 {
		out := cpu()
		maps.Copy(out, counts.snapshot())
		status := queryPairs(context.Background(), admin, "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions','Com_commit','Innodb_data_fsyncs','Innodb_buffer_pool_reads','Innodb_row_lock_waits')")
		for name, value := range status {
			if label := vars[name]; label != "" {
				out[label], _ = strconv.ParseFloat(value, 64)
			}
		}
		return out
	}
}

func mariaAndRedisProbe(maria func() map[string]float64) func() map[string]float64 {
	redisCPU := cpuProbe(map[string]string{"cpu_redis": "redis-server"})
	return func() map[string]float64 {
		out := maria()
		for k, v := range redisCPU() {
			if k != "cpu_self" {
				out[k] = v
			}
		}
		return out
	}
}

// cpuProbe returns the CPU seconds used so far by this process (cpu_self) and
// by the named other processes (label → comm), read from /proc: all the
// processes of that name together, since a second server of the same
// program (a Galera node, a throw-away server) may run beside the one
// measured; an idle one adds nothing.
func cpuProbe(others map[string]string) func() map[string]float64 {
	pids := map[string][]int{}
	for label, comm := range others {
		if found := findProcesses(comm); len(found) > 0 {
			pids[label] = found
		}
	}
	return func() map[string]float64 {
		out := map[string]float64{"cpu_self": procCPU("self"), "cpu_total": machineBusyCPU()}
		for label, found := range pids {
			for _, pid := range found {
				out[label] += procCPU(strconv.Itoa(pid))
			}
		}
		return out
	}
}

// procCPU is utime+stime of /proc/<pid>/stat in seconds (USER_HZ = 100).
func procCPU(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	fields := strings.Fields(s)
	if len(fields) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return (ut + st) / 100
}

// machineBusyCPU is the CPU seconds all cores spent busy so far (/proc/stat:
// everything but idle and iowait).
func machineBusyCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	var busy float64
	for i, f := range fields[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		busy += v
	}
	return busy / 100
}

// findProcesses returns the pids of the processes whose comm is name.
func findProcesses(name string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err == nil && strings.TrimSpace(string(comm)) == name {
			pids = append(pids, pid)
		}
	}
	return pids
}

// perRequest turns two probe readings around a window into the point's
// server columns: CPU as percent of one core over the window and
// milliseconds per request, counters per request.
func perRequest(before, after map[string]float64, dur time.Duration, requests int64) map[string]float64 {
	if before == nil || after == nil || requests == 0 {
		return nil
	}
	out := map[string]float64{}
	for k, a := range after {
		d := a - before[k]
		if strings.HasPrefix(k, "cpu_") {
			// CPU seconds → percent of one core over the window, and
			// milliseconds per request.
			out[k] = 100 * d / dur.Seconds()
			if k == "cpu_self" || k == "cpu_db" || k == "cpu_redis" {
				out[k+"_ms_per_req"] = 1000 * d / float64(requests)
			}
			continue
		}
		out[k] = d / float64(requests)
	}
	if total, ok := out["cpu_total"]; ok {
		// Everything else on the machine: other engineers' builds and
		// tests show up here, and make the point noisy.
		out["cpu_other"] = max(0, total-out["cpu_self"]-out["cpu_db"]-out["cpu_redis"])
		delete(out, "cpu_total")
	}
	return out
}
