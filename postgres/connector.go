package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// SlotWait bounds how long a connection attempt of a pool from Open, OpenDB
// or NewConnector waits when the server refuses it for want of a slot
// (SQLSTATE 53300, too many clients: max_connections, or a role's or a
// database's CONNECTION LIMIT). A slot frees up when another pool closes
// an idle connection or the backends of a process that died exit, which
// takes moments; a request that cannot get one within SlotWait fails with
// the 53300, which idempotency.IsTransient classifies as retryable (the
// middleware answers 503 with Retry-After). The request's context bounds
// the wait too.
const SlotWait = 2 * time.Second

// connectRetries bounds how often a connection attempt that the network
// cut before the session was established (ECONNRESET, EOF) is made again.
// Nothing ran on such a connection, so trying again is always safe; a
// PostgreSQL connection takes a new server process, several milliseconds
// or, with many at once on a busy server, tens of them, so a flapping
// network or load balancer cuts many of them midway.
const connectRetries = 3

// connector is the driver.Connector of OpenDB's pools: pgx's, with patience
// for a full server and a cut connection attempt, and connections that
// send single-phase's record with the COMMIT (conn). Open's pool has pool
// too, which its connections tell when they die (see adaptive).
type connector struct {
	driver.Connector
	pool *adaptive
}

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: dc.(*stdlib.Conn), pool: c.pool, born: time.Now()}, nil
}

// Close stops the pool's sizing; database/sql calls it from DB.Close.
func (c connector) Close() error {
	c.pool.close()
	return nil
}

func (c connector) Driver() driver.Driver { return pipelinedDriver{c.Connector.Driver()} }

// connect makes connection attempts until one succeeds, fails for a reason
// that waiting cannot cure, or its bound (SlotWait, connectRetries, the
// context) is spent.
func (c connector) connect(ctx context.Context) (driver.Conn, error) {
	var slotDeadline time.Time
	for cuts := 0; ; {
		began := time.Now()
		dc, err := c.Connector.Connect(ctx)
		var pause time.Duration
		switch {
		case err == nil:
			return dc, nil
		case refusedForWantOfASlot(err):
			if slotDeadline.IsZero() {
				slotDeadline = time.Now().Add(SlotWait)
			}
			if !time.Now().Before(slotDeadline) {
				return nil, err
			}
			pause = jitter(20 * time.Millisecond)
		case cutBeforeSession(err) && cuts < connectRetries:
			c.pool.died(began, began)
			cuts++
			pause = jitter(5 * time.Millisecond)
		default:
			return nil, classifyConnect(err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
	}
}

// jitter returns a pause between d and 2d, so that the attempts of many
// requests waiting at once spread out.
func jitter(d time.Duration) time.Duration { return d + rand.N(d+1) }

// refusedForWantOfASlot reports the server's 53300, too_many_connections.
func refusedForWantOfASlot(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "53300"
}

// cutBeforeSession reports a connection attempt that reached the server
// and was cut before the session was ready: reset, or closed midway. A
// refused or timed-out dial is not one: the server is down or unreachable,
// and the request should hear so at once.
func cutBeforeSession(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
