package orderservice

import (
	"context"
	"database/sql"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
)

// OpenMySQL opens cfg the way the examples recommend: on
// idempotency.OpenMySQL's pool (a single-phase record's INSERT travels with
// the COMMIT), interpolateParams (one round trip per statement instead of
// prepare, execute and close),
// parseTime, a 5 s innodb_lock_wait_timeout unless cfg sets one (a claim
// waiting on a stuck transaction is retried a few times, and that budget must
// stay well inside the lease), a pool of 64, and a ping.
func OpenMySQL(ctx context.Context, cfg *mysql.Config) (*sql.DB, error) {
	cfg = cfg.Clone()
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	if _, set := cfg.Params["innodb_lock_wait_timeout"]; !set {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["innodb_lock_wait_timeout"] = "5"
	}
	db, err := idempotency.OpenMySQL(cfg)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	db.SetConnMaxLifetime(time.Hour)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}
