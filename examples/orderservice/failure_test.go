package orderservice_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// nextFault is an AfterCreate hook that fails the next create with the
// error set, once.
type nextFault struct {
	mu  sync.Mutex
	err error
}

func (f *nextFault) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *nextFault) afterCreate(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.err
	f.err = nil
	return err
}

type faultCase struct {
	name       string
	err        error
	status     int
	kind       string
	retryAfter string
}

// handlerFaults are database errors inside the create transaction (after the
// order row is written) and the answers they must get.
func handlerFaults() []faultCase {
	unavailable := func(name string, err error) faultCase {
		return faultCase{name, err, http.StatusServiceUnavailable, idempotency.ProblemStoreUnavailable, "1"}
	}
	failed := func(name string, err error) faultCase {
		return faultCase{name, err, http.StatusInternalServerError, idempotency.ProblemExecutionFailed, ""}
	}
	return []faultCase{
		unavailable("deadlock", fmt.Errorf("redeem coupon: %w",
			&mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock"})),
		unavailable("lock wait timeout", fmt.Errorf("insert order: %w",
			&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"})),
		unavailable("dropped connection", fmt.Errorf("insert order: %w", driver.ErrBadConn)),
		unavailable("marked transient", fmt.Errorf("reserve stock: %w", idempotency.ErrTransient)),
		failed("server error that is not transient", fmt.Errorf("insert order: %w",
			&mysql.MySQLError{Number: 1054, Message: "Unknown column"})),
		failed("plain error", errors.New("pricing: nil catalog")),
	}
}

// TestCreate_DatabaseErrorInTheHandler_TransientIs503RetryAfter_OtherIs500_NothingKept_RetryExecutes:
// a transient error is 503 store-unavailable with Retry-After: 1, anything
// else 500 execution-failed. Either way the transaction rolls back (no
// order) and the key is released, so the retry with the same key creates the
// order.
func TestCreate_DatabaseErrorInTheHandler_TransientIs503RetryAfter_OtherIs500_NothingKept_RetryExecutes(t *testing.T) {
	t.Parallel()
	modes := map[string]idempotency.Mode{"claim-first": idempotency.ModeClaimFirst, "single-phase": idempotency.ModeSinglePhase}
	for _, dialect := range orderDialects {
		for modeName, mode := range modes {
			t.Run(dialect+"/"+modeName, func(t *testing.T) {
				t.Parallel()
				fault := &nextFault{}
				b := startOrderService(t, dialect, orderservice.Options{
					Idempotency: true, AfterCreate: fault.afterCreate, Config: idempotency.Config{Mode: mode},
				})
				const body = `{"user_id":7,"sku_id":20001,"quantity":1}`
				for i, tc := range handlerFaults() {
					t.Run(tc.name, func(t *testing.T) {
						key := "fault-" + strconv.Itoa(i)
						before := b.orders(t)
						fault.set(tc.err)

						a := b.create(t, "7", key, body)
						require.Equal(t, tc.status, a.status, a.body)
						require.Equal(t, tc.kind, a.problemKind(t))
						require.Equal(t, tc.retryAfter, a.header.Get("Retry-After"))
						if tc.status == http.StatusServiceUnavailable {
							require.Contains(t, a.body, "nothing was recorded. Retry with the same key.")
						}
						require.Equal(t, before, b.orders(t), "the failed attempt's order is rolled back")

						retry := b.create(t, "7", key, body)
						require.Equal(t, http.StatusCreated, retry.status, "the key was released: %s", retry.body)
						require.Empty(t, retry.header.Get("Idempotent-Replayed"), "the retry executes, it does not replay")
						require.Equal(t, before+1, b.orders(t))
					})
				}
			})
		}
	}
}

// TestCreate_Unprotected_TransientHandlerErrorIs503RetryAfter_OtherIs500: the
// baseline without the middleware classifies the same way.
func TestCreate_Unprotected_TransientHandlerErrorIs503RetryAfter_OtherIs500(t *testing.T) {
	t.Parallel()
	fault := &nextFault{}
	b := startOrderService(t, "mysql", orderservice.Options{Idempotency: false, AfterCreate: fault.afterCreate})
	for _, tc := range handlerFaults() {
		t.Run(tc.name, func(t *testing.T) {
			before := b.orders(t)
			fault.set(tc.err)
			a := b.create(t, "7", "", `{"user_id":7,"sku_id":20001,"quantity":1}`)
			require.Equal(t, tc.status, a.status, a.body)
			require.Equal(t, tc.kind, a.problemKind(t))
			require.Equal(t, tc.retryAfter, a.header.Get("Retry-After"))
			require.Equal(t, before, b.orders(t), "rolled back")
		})
	}
}
