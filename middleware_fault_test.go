package idempotency_test

// Fault-injection tests: every statement of the protocol (claim, lookup,
// takeover, BEGIN, the business statement, finalize, COMMIT, the FAILED
// finish and the release) fails in turn under the real middleware over the
// real MySQL store, with go-sqlmock as the database. Each case scripts the
// exact statements expected, in order, and asserts the client's answer.
//
// The invariant behind every case: the middleware never answers 2xx for an
// order that did not commit, and never answers failure for one that did.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
)

// The request every case sends.
const (
	faultScope    = "tenant-7"
	faultKey      = "order-key-1"
	faultBody     = `{"sku":"A-1","qty":2}`
	faultInstance = "fault-test"
)

// The handler's answers.
const (
	faultOrderBody      = `{"order_id":"ord-42"}`
	faultOrderLocation  = "/orders/ord-42"
	faultRejectedBody   = `{"error":"unknown_sku"}`
	faultDBFailureBody  = `{"error":"database"}`
	faultOtherOrderBody = `{"order_id":"ord-41"}` // another attempt's snapshot
	faultOtherLocation  = "/orders/ord-41"
)

// Statements, matched by a distinctive prefix (sqlmock.QueryMatcherRegexp).
const (
	faultSQLClaim    = `INSERT INTO idempotency_record`
	faultSQLLookup   = `SELECT request_fingerprint`
	faultSQLTakeOver = `UPDATE idempotency_record SET\s+created_at`
	faultSQLFinish   = `UPDATE idempotency_record SET\s+status`
	faultSQLRelease  = `DELETE FROM idempotency_record`
	faultSQLOrder    = `INSERT INTO purchase_order`
)

// Config defaults the statements carry, in microseconds.
var (
	faultLeaseMicros     = (30 * time.Second).Microseconds()
	faultRetentionMicros = (24 * time.Hour).Microseconds()
)

// Injected faults.
var (
	errFaultStoreDown     = errors.New("dial tcp 10.0.0.5:3306: connect: connection refused")
	errFaultDuplicate     = &mysql.MySQLError{Number: 1062, Message: "Duplicate entry 'tenant-7-order-key-1' for key 'PRIMARY'"}
	errFaultDeadlock      = &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}
	errFaultLockWait      = &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded; try restarting transaction"}
	errFaultRecordChanged = &mysql.MySQLError{Number: 1020, Message: "Record has changed since last read in table 'idempotency_record'"}
	errFaultCommitFailed  = &mysql.MySQLError{Number: 1180, Message: "Got error 149 during COMMIT"}
	errFaultUnknownSKU    = &mysql.MySQLError{Number: 1452, Message: "Cannot add or update a child row: a foreign key constraint fails"}
)

// faultClaimAttempts is the store's budget for a transient error on one autocommit
// statement: the first attempt plus four retries.
const faultClaimAttempts = 5

var (
	faultAffected1 = sqlmock.NewResult(0, 1)
	faultAffected0 = sqlmock.NewResult(0, 0) // a fenced statement that lost its lease
)

// ---------------------------------------------------------------------------
// Handlers.

// faultCreateOrder is the business handler: one INSERT in the middleware's
// transaction, answered 201 JSON; an unknown SKU (foreign key violation) is a
// business rejection, 422; any other database error is 500.
func faultCreateOrder(w http.ResponseWriter, r *http.Request) {
	tx, ok := idempotency.TxFromContext(r.Context())
	if !ok {
		faultWriteJSON(w, http.StatusInternalServerError, `{"error":"no transaction"}`)
		return
	}
	scope, key, _ := idempotency.KeyFromContext(r.Context())
	var in struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		faultWriteJSON(w, http.StatusBadRequest, `{"error":"body"}`)
		return
	}
	_, err := tx.ExecContext(r.Context(),
		"INSERT INTO purchase_order (scope, idempotency_key, sku, qty) VALUES (?, ?, ?, ?)",
		scope, key, in.SKU, in.Qty)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == 1452:
		faultWriteJSON(w, http.StatusUnprocessableEntity, faultRejectedBody)
	case err != nil:
		faultWriteJSON(w, http.StatusInternalServerError, faultDBFailureBody)
	default:
		w.Header().Set("Location", faultOrderLocation)
		faultWriteJSON(w, http.StatusCreated, faultOrderBody)
	}
}

// faultPanicAfterInsert writes the order row, then panics.
func faultPanicAfterInsert(w http.ResponseWriter, r *http.Request) {
	tx, _ := idempotency.TxFromContext(r.Context())
	_, _ = tx.ExecContext(r.Context(),
		"INSERT INTO purchase_order (scope, idempotency_key, sku, qty) VALUES (?, ?, ?, ?)",
		faultScope, faultKey, "A-1", 2)
	panic("nil map in pricing")
}

func faultWriteJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

func newFaultRequest() *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(faultBody))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", faultKey)
	return r
}

// ---------------------------------------------------------------------------
// The statement log.

// faultLog records every statement sent to the mock, as a label.
type faultLog struct {
	mu  sync.Mutex
	got []string
}

// faultStatements label statements by the prefixes the expectations use.
var faultStatements = []struct {
	label string
	re    *regexp.Regexp
}{
	{"claim", regexp.MustCompile(faultSQLClaim)},
	{"lookup", regexp.MustCompile(faultSQLLookup)},
	{"takeover", regexp.MustCompile(faultSQLTakeOver)},
	{"finish", regexp.MustCompile(faultSQLFinish)},
	{"release", regexp.MustCompile(faultSQLRelease)},
	{"extend", regexp.MustCompile(`UPDATE idempotency_record SET\s+locked_until`)},
	{"order", regexp.MustCompile(faultSQLOrder)},
}

func (l *faultLog) add(query string) {
	label := query // an unknown statement shows as itself
	for _, st := range faultStatements {
		if st.re.MatchString(query) {
			label = st.label
			break
		}
	}
	l.mu.Lock()
	l.got = append(l.got, label)
	l.mu.Unlock()
}

func (l *faultLog) labels() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// faultConn forwards to sqlmock's connection, logging first.
type faultConn struct {
	mock driver.Conn
	log  *faultLog
}

var (
	_ driver.ExecerContext     = (*faultConn)(nil)
	_ driver.QueryerContext    = (*faultConn)(nil)
	_ driver.ConnBeginTx       = (*faultConn)(nil)
	_ driver.NamedValueChecker = (*faultConn)(nil)
)

func (c *faultConn) Prepare(query string) (driver.Stmt, error) {
	c.log.add(query)
	return c.mock.Prepare(query)
}

// Close leaves the mock open: database/sql closes connections it discards
// (after driver.ErrBadConn), and the mock serves the next one.
func (c *faultConn) Close() error { return nil }

func (c *faultConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *faultConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.log.add("BEGIN")
	tx, err := c.mock.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return faultTx{tx: tx, log: c.log}, nil
}

func (c *faultConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.log.add(query)
	return c.mock.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *faultConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.log.add(query)
	return c.mock.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *faultConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.mock.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type faultTx struct {
	tx  driver.Tx
	log *faultLog
}

func (t faultTx) Commit() error {
	t.log.add("COMMIT")
	return t.tx.Commit()
}

func (t faultTx) Rollback() error {
	t.log.add("ROLLBACK")
	return t.tx.Rollback()
}

type faultConnector struct{ conn *faultConn }

func (c faultConnector) Connect(context.Context) (driver.Conn, error) { return c.conn, nil }
func (c faultConnector) Driver() driver.Driver                        { return c }
func (c faultConnector) Open(string) (driver.Conn, error)             { return c.conn, nil }

// ---------------------------------------------------------------------------
// The owner of this attempt.

// faultOurs stands, in a row, for the lease owner this attempt generated;
// faultTheirs is another attempt's.
const (
	faultOurs   = "<this attempt's owner>"
	faultTheirs = "other-host-9/00ff00ff00ff00ff"
)

// faultClaimOwner tracks the lease owners the claim statements of one
// request carry. The middleware generates them at random, a fresh one for
// every round of its claim, so each claim statement's argument
// (faultClaimArg) accepts a new owner of this instance, remembers it, and
// fills in the rows that must show it (a re-read of "our" record) now that
// it is known.
type faultClaimOwner struct {
	mu       sync.Mutex
	owners   []string // the owner of each claim statement, in order
	scripted int      // claim statements scripted so far
	pending  map[int][]func(owner string)
}

// claimArg returns the argument of the next claim statement scripted.
func (c *faultClaimOwner) claimArg() faultClaimArg { return c.next(true) }

// insertArg returns the argument of the next single-phase record INSERT
// scripted: every run of one request inserts under the same owner.
func (c *faultClaimOwner) insertArg() faultClaimArg { return c.next(false) }

func (c *faultClaimOwner) next(fresh bool) faultClaimArg {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scripted++
	return faultClaimArg{c: c, round: c.scripted - 1, fresh: fresh}
}

// faultClaimArg is the sqlmock.Argument for the owner column of one claim
// (or record INSERT) statement.
type faultClaimArg struct {
	c     *faultClaimOwner
	round int
	fresh bool // the owner must be new: a claim's round
}

func (a faultClaimArg) Match(v driver.Value) bool {
	s, ok := v.(string)
	if !ok || !strings.HasPrefix(s, faultInstance+"/") {
		return false
	}
	c := a.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.round < len(c.owners) {
		return s == c.owners[a.round]
	}
	if a.round != len(c.owners) {
		return false
	}
	last := len(c.owners) > 0 && s == c.owners[len(c.owners)-1]
	if a.fresh && !last && slices.Contains(c.owners, s) {
		// The store may send one claim again (a lock wait timed out):
		// the same owner; a new round of the claim has an owner of its
		// own, never an earlier round's.
		return false
	}
	if !a.fresh && len(c.owners) > 0 && !last {
		return false // one owner for every run of a single-phase request
	}
	c.owners = append(c.owners, s)
	for _, fill := range c.pending[a.round] {
		fill(s)
	}
	delete(c.pending, a.round)
	return true
}

// whenKnown runs fill with the owner of the latest claim scripted, once
// that claim has revealed it.
func (c *faultClaimOwner) whenKnown(fill func(owner string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	round := c.scripted - 1
	if round < len(c.owners) {
		fill(c.owners[round])
		return
	}
	if c.pending == nil {
		c.pending = map[int][]func(string){}
	}
	c.pending[round] = append(c.pending[round], fill)
}

// faultSameOwner matches only the owner the latest claim generated: a
// takeover and fenced statements (finish, release) carry this round's lease.
type faultSameOwner struct{ c *faultClaimOwner }

func (s faultSameOwner) Match(v driver.Value) bool {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return len(s.c.owners) > 0 && v == s.c.owners[len(s.c.owners)-1]
}

// ---------------------------------------------------------------------------
// Stored records.

var faultLookupColumns = []string{
	"request_fingerprint", "status", "locked_by", "lease_version",
	"response_status", "response_headers", "response_body",
	"created_at", "updated_at", "locked_until", "expires_at",
	"lease_expired", "expired", "read_at",
}

// faultRow is the record a lookup returns.
type faultRow struct {
	fingerprint  string // "" means the request's own fingerprint
	status       idempotency.Status
	owner        string // faultOurs or faultTheirs
	version      int64
	code         int // stored response status; 0 for PROCESSING
	body         string
	location     string
	leaseExpired bool
	expired      bool
}

func faultProcessing(owner string, version int64) faultRow {
	return faultRow{status: idempotency.StatusProcessing, owner: owner, version: version}
}

// faultDoneByUs is our own attempt's committed record: finish bumped the version.
func faultDoneByUs(version int64) faultRow {
	return faultRow{status: idempotency.StatusDone, owner: faultOurs, version: version,
		code: http.StatusCreated, body: faultOrderBody, location: faultOrderLocation}
}

func faultDoneByThem(version int64) faultRow {
	return faultRow{status: idempotency.StatusDone, owner: faultTheirs, version: version,
		code: http.StatusCreated, body: faultOtherOrderBody, location: faultOtherLocation}
}

// ---------------------------------------------------------------------------
// The harness.

type faultHarness struct {
	t     *testing.T
	mock  sqlmock.Sqlmock
	db    *sql.DB // over the mock, logging every statement
	fp    string
	owner *faultClaimOwner

	scripted []string // the statements scripted, in order
	executed *faultLog

	mu     sync.Mutex
	events []idempotency.Event

	mode idempotency.Mode // claim-first unless a spec sets it
}

func newFaultHarness(t *testing.T) *faultHarness {
	t.Helper()
	mockDB, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherRegexp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mockDB.Close() })

	// sqlmock hands its one mock connection to every Open. The store gets it
	// through faultConn, which logs each statement before the mock answers:
	// sqlmock answers an unscripted statement with an error rather than
	// failing the test, and the middleware ignores some errors (a ROLLBACK,
	// a best-effort release), so only the log shows such a statement.
	conn, ok := mock.(driver.Conn)
	require.True(t, ok, "sqlmock's mock is its driver connection")
	executed := &faultLog{}
	db := sql.OpenDB(faultConnector{&faultConn{mock: conn, log: executed}})
	t.Cleanup(func() { _ = db.Close() })

	fp, err := idempotency.NewFingerprint(idempotency.FingerprintConfig{})(newFaultRequest(), []byte(faultBody))
	require.NoError(t, err)
	return &faultHarness{t: t, mock: mock, db: db, fp: fp, owner: &faultClaimOwner{}, executed: executed}
}

// serve sends the order request through the middleware wrapping handler and
// reports the answer and whether the handler ran.
func (h *faultHarness) serve(handler http.HandlerFunc) (*httptest.ResponseRecorder, bool) {
	h.t.Helper()
	cfg := &idempotency.Config{
		Route:      "create_order",
		Mode:       h.mode,
		ScopeFunc:  func(*http.Request) (string, error) { return faultScope, nil },
		InstanceID: faultInstance,
		Observer: idempotency.ObserverFunc(func(_ context.Context, e idempotency.Event) {
			h.mu.Lock()
			h.events = append(h.events, e)
			h.mu.Unlock()
		}),
	}
	// The scripted statements are the protocol's: the dialect's one-time
	// probe of the server (Adapt) is left out and tested on real servers.
	dialect := idempotency.MySQLDialect
	dialect.Adapt = nil
	m, err := idempotency.New(idempotency.NewSQLStore(h.db, dialect), cfg)
	require.NoError(h.t, err)

	var ran atomic.Bool
	wrapped := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Store(true)
		handler(w, r)
	}))
	res := httptest.NewRecorder()
	wrapped.ServeHTTP(res, newFaultRequest())
	return res, ran.Load()
}

// Script: one helper per statement.

func (h *faultHarness) expectClaim() *sqlmock.ExpectedExec {
	h.scripted = append(h.scripted, "claim")
	return h.mock.ExpectExec(faultSQLClaim).
		WithArgs(faultScope, faultKey, h.fp, h.owner.claimArg(), faultLeaseMicros, faultRetentionMicros)
}

func (h *faultHarness) claimed()           { h.expectClaim().WillReturnResult(faultAffected1) }
func (h *faultHarness) claimTaken()        { h.expectClaim().WillReturnError(errFaultDuplicate) }
func (h *faultHarness) claimFails(e error) { h.expectClaim().WillReturnError(e) }

func (h *faultHarness) expectLookup() *sqlmock.ExpectedQuery {
	h.scripted = append(h.scripted, "lookup")
	return h.mock.ExpectQuery(faultSQLLookup).WithArgs(faultScope, faultKey)
}

// lookupFinds returns r, filling in our owner once the claim has revealed it.
func (h *faultHarness) lookupFinds(r faultRow) {
	rows := sqlmock.NewRows(faultLookupColumns)
	if r.owner == faultOurs {
		h.owner.whenKnown(func(owner string) { rows.AddRow(h.recordValues(r, owner)...) })
	} else {
		rows.AddRow(h.recordValues(r, r.owner)...)
	}
	h.expectLookup().WillReturnRows(rows)
}

func (h *faultHarness) lookupFindsNothing() {
	h.expectLookup().WillReturnRows(sqlmock.NewRows(faultLookupColumns))
}
func (h *faultHarness) lookupFails(e error) { h.expectLookup().WillReturnError(e) }

func (h *faultHarness) recordValues(r faultRow, owner string) []driver.Value {
	now := time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)
	fp := r.fingerprint
	if fp == "" {
		fp = h.fp
	}
	var (
		code        any
		headers     []byte
		body        []byte
		lockedUntil any = now.Add(30 * time.Second)
	)
	if r.status.Final() {
		code, headers, body, lockedUntil = int64(r.code), faultSnapshotHeaders(r.location), []byte(r.body), nil
	}
	return []driver.Value{fp, string(r.status), owner, r.version, code, headers, body,
		now.Add(-time.Minute), now, lockedUntil, now.Add(24 * time.Hour), r.leaseExpired, r.expired, now}
}

// faultSnapshotHeaders is the stored JSON of the headers the middleware keeps.
func faultSnapshotHeaders(location string) []byte {
	b, _ := json.Marshal(http.Header{"Content-Type": {"application/json"}, "Location": {location}})
	return b
}

// expectTakeOver re-claims the record read as held by prevOwner at version.
func (h *faultHarness) expectTakeOver(prevOwner string, version int64) *sqlmock.ExpectedExec {
	h.scripted = append(h.scripted, "takeover")
	return h.mock.ExpectExec(faultSQLTakeOver).
		WithArgs(h.fp, faultSameOwner{h.owner}, faultLeaseMicros, faultRetentionMicros, faultScope, faultKey, prevOwner, version)
}

func (h *faultHarness) expectBegin() *sqlmock.ExpectedBegin {
	h.scripted = append(h.scripted, "BEGIN")
	return h.mock.ExpectBegin()
}

func (h *faultHarness) begin() { h.expectBegin() }

func (h *faultHarness) expectCommit() *sqlmock.ExpectedCommit {
	h.scripted = append(h.scripted, "COMMIT")
	return h.mock.ExpectCommit()
}

func (h *faultHarness) commits() { h.expectCommit() }

func (h *faultHarness) rollsBack() {
	h.scripted = append(h.scripted, "ROLLBACK")
	h.mock.ExpectRollback()
}

func (h *faultHarness) expectOrderInsert() *sqlmock.ExpectedExec {
	h.scripted = append(h.scripted, "order")
	return h.mock.ExpectExec(faultSQLOrder).WithArgs(faultScope, faultKey, "A-1", 2)
}

func (h *faultHarness) orderInserted() { h.expectOrderInsert().WillReturnResult(faultAffected1) }

// expectFinishDone is the finalize UPDATE inside the business transaction: the
// handler's 201 becomes the DONE snapshot, fenced by our lease at version.
func (h *faultHarness) expectFinishDone(version int64) *sqlmock.ExpectedExec {
	h.scripted = append(h.scripted, "finish")
	return h.mock.ExpectExec(faultSQLFinish).WithArgs(string(idempotency.StatusDone), http.StatusCreated,
		faultSnapshotHeaders(faultOrderLocation), []byte(faultOrderBody), faultRetentionMicros,
		faultScope, faultKey, faultSameOwner{h.owner}, version)
}

// expectFinishFailed is the autocommit UPDATE storing the handler's 422.
func (h *faultHarness) expectFinishFailed(version int64) *sqlmock.ExpectedExec {
	headers, _ := json.Marshal(http.Header{"Content-Type": {"application/json"}})
	h.scripted = append(h.scripted, "finish")
	return h.mock.ExpectExec(faultSQLFinish).WithArgs(string(idempotency.StatusFailed), http.StatusUnprocessableEntity,
		headers, []byte(faultRejectedBody), faultRetentionMicros, faultScope, faultKey, faultSameOwner{h.owner}, version)
}

// expectRelease is the fenced DELETE of our PROCESSING record.
func (h *faultHarness) expectRelease(version int64) *sqlmock.ExpectedExec {
	h.scripted = append(h.scripted, "release")
	return h.mock.ExpectExec(faultSQLRelease).WithArgs(faultScope, faultKey, faultSameOwner{h.owner}, version)
}

// executedUntilCommit scripts a fresh claim, BEGIN, the order INSERT and the
// DONE finalize: everything up to COMMIT.
func (h *faultHarness) executedUntilCommit() {
	h.claimed()
	h.begin()
	h.orderInserted()
	h.expectFinishDone(1).WillReturnResult(faultAffected1)
}

// ---------------------------------------------------------------------------
// Cases.

// faultWant is what the client and the database must see.
type faultWant struct {
	status     int
	problem    string // problem kind of a problem+json answer; "" for the handler's or a replayed answer
	body       string // exact body of a non-problem answer
	location   string
	replayed   bool // Idempotent-Replayed: true
	retryAfter string
	handlerRan bool
	outcome    idempotency.Outcome // the final outcome observed

	// replayMarkOptional accepts the answer with or without the replay
	// mark (a fix may answer either way).
	replayMarkOptional bool
}

type faultCase struct {
	name    string
	handler http.HandlerFunc // nil: faultCreateOrder
	script  func(h *faultHarness)
	want    faultWant
}

func runFaultCases(t *testing.T, cases []faultCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newFaultHarness(t)
			tc.script(h)
			handler := tc.handler
			if handler == nil {
				handler = faultCreateOrder
			}
			res, ran := h.serve(handler)
			h.check(res, ran, tc.want)
		})
	}
}

func (h *faultHarness) check(res *httptest.ResponseRecorder, ran bool, w faultWant) {
	t := h.t
	t.Helper()
	assert.Equal(t, w.status, res.Code, "status; body: %s", res.Body)
	if w.problem != "" {
		assert.Equal(t, "application/problem+json", res.Header().Get("Content-Type"))
		var p idempotency.Problem
		if assert.NoError(t, json.Unmarshal(res.Body.Bytes(), &p), "problem body: %s", res.Body) {
			assert.Equal(t, idempotency.ProblemTypePrefix+w.problem, p.Type, "problem type; detail: %s", p.Detail)
			assert.Equal(t, w.status, p.Status, "problem status")
		}
	} else {
		assert.Equal(t, w.body, res.Body.String(), "body")
	}
	assert.Equal(t, w.location, res.Header().Get("Location"), "Location")
	if !w.replayMarkOptional {
		wantMark := ""
		if w.replayed {
			wantMark = "true"
		}
		assert.Equal(t, wantMark, res.Header().Get("Idempotent-Replayed"), "Idempotent-Replayed")
	}
	assert.Equal(t, w.retryAfter, res.Header().Get("Retry-After"), "Retry-After")
	assert.Equal(t, w.handlerRan, ran, "handler ran")

	h.mu.Lock()
	events := append([]idempotency.Event(nil), h.events...)
	h.mu.Unlock()
	if assert.NotEmpty(t, events, "observed outcomes") && w.outcome != "" {
		assert.Equal(t, w.outcome, events[len(events)-1].Outcome, "final outcome; all: %v", events)
	}
	assert.Equal(t, h.scripted, h.executed.labels(), "statements sent: exactly the scripted ones")
	assert.NoError(t, h.mock.ExpectationsWereMet(), "every scripted statement ran, in order")
}

// Common answers.
var (
	faultCreated = faultWant{status: http.StatusCreated, body: faultOrderBody, location: faultOrderLocation,
		handlerRan: true, outcome: idempotency.OutcomeCommitted}
	faultStoreUnavailable = faultWant{status: http.StatusServiceUnavailable, problem: idempotency.ProblemStoreUnavailable,
		retryAfter: "1", outcome: idempotency.OutcomeStoreError}
	faultInProgress = faultWant{status: http.StatusConflict, problem: idempotency.ProblemInProgress, retryAfter: "1",
		outcome: idempotency.OutcomeInProgress}
	faultKeyReused = faultWant{status: http.StatusConflict, problem: idempotency.ProblemKeyReused,
		outcome: idempotency.OutcomeConflict}
	// An infrastructure fault after the claim: rolled back, released, and
	// the client told when to retry.
	faultReleasedAfterExecuting = faultWant{status: http.StatusServiceUnavailable, problem: idempotency.ProblemStoreUnavailable,
		retryAfter: "1", handlerRan: true, outcome: idempotency.OutcomeReleased}
	// The handler's own failure (a panic): the only 500.
	faultHandlerPanicked = faultWant{status: http.StatusInternalServerError, problem: idempotency.ProblemExecutionFailed,
		handlerRan: true, outcome: idempotency.OutcomeReleased}
	faultHandlerFailure = faultWant{status: http.StatusInternalServerError, body: faultDBFailureBody,
		handlerRan: true, outcome: idempotency.OutcomeReleased}
	faultRejected = faultWant{status: http.StatusUnprocessableEntity, body: faultRejectedBody,
		handlerRan: true, outcome: idempotency.OutcomeRejected}
	faultCommitUnknown = faultWant{status: http.StatusServiceUnavailable, problem: idempotency.ProblemCommitUnknown, retryAfter: "1",
		handlerRan: true, outcome: idempotency.OutcomeUnknown}
)

// ran returns w with the handler having run (or not).
func (w faultWant) ran(ran bool) faultWant { w.handlerRan = ran; return w }

// faultReplayOf is the replay of a stored 201.
func faultReplayOf(body, location string) faultWant {
	return faultWant{status: http.StatusCreated, body: body, location: location, replayed: true,
		outcome: idempotency.OutcomeReplayed}
}

// ---------------------------------------------------------------------------
// 1–2. The claim INSERT.

func TestFault_ClaimInsertFails_Answers503AndNeverExecutes(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name:   "generic error: 503 store-unavailable, no BEGIN",
			script: func(h *faultHarness) { h.claimFails(errFaultStoreDown) },
			want:   faultStoreUnavailable,
		},
		{
			name: "deadlock on every attempt: retries exhausted, 503, handler never ran",
			script: func(h *faultHarness) {
				for range faultClaimAttempts {
					h.claimFails(errFaultDeadlock)
				}
			},
			want: faultStoreUnavailable,
		},
		{
			name: "lock wait timeout on every attempt: retries exhausted, 503",
			script: func(h *faultHarness) {
				for range faultClaimAttempts {
					h.claimFails(errFaultLockWait)
				}
			},
			want: faultStoreUnavailable,
		},
	})
}

func TestFault_ClaimInsertTransient_IsRetriedAndExecutesOnce(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "deadlock once, then claimed: 201",
			script: func(h *faultHarness) {
				h.claimFails(errFaultDeadlock)
				h.executedUntilCommit()
				h.commits()
			},
			want: faultCreated,
		},
		{
			name: "lock wait timeout twice, then claimed: 201",
			script: func(h *faultHarness) {
				h.claimFails(errFaultLockWait)
				h.claimFails(errFaultLockWait)
				h.executedUntilCommit()
				h.commits()
			},
			want: faultCreated,
		},
	})
}

// ---------------------------------------------------------------------------
// 3–5. A duplicate claim and the lookup of the existing record.

func TestFault_DuplicateClaim_AnswersFromTheStoredRecordWithoutExecuting(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "record unreadable: 503, handler not run",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFails(errFaultStoreDown)
			},
			want: faultStoreUnavailable,
		},
		{
			name: "DONE with the same fingerprint: its 201 replayed",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFinds(faultDoneByThem(2))
			},
			want: faultReplayOf(faultOtherOrderBody, faultOtherLocation),
		},
		{
			name: "FAILED with the same fingerprint: its 422 replayed",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFinds(faultRow{status: idempotency.StatusFailed, owner: faultTheirs, version: 2,
					code: http.StatusUnprocessableEntity, body: faultRejectedBody, location: faultOtherLocation})
			},
			want: faultWant{status: http.StatusUnprocessableEntity, body: faultRejectedBody, location: faultOtherLocation,
				replayed: true, outcome: idempotency.OutcomeReplayed},
		},
		{
			name: "DONE with a different fingerprint: 409 key-reused",
			script: func(h *faultHarness) {
				h.claimTaken()
				r := faultDoneByThem(2)
				r.fingerprint = "another request"
				h.lookupFinds(r)
			},
			want: faultKeyReused,
		},
		{
			name: "PROCESSING with a different fingerprint: 409 key-reused",
			script: func(h *faultHarness) {
				h.claimTaken()
				r := faultProcessing(faultTheirs, 1)
				r.fingerprint = "another request"
				h.lookupFinds(r)
			},
			want: faultKeyReused,
		},
		{
			name: "PROCESSING with a live lease: 409 in-progress with Retry-After",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFinds(faultProcessing(faultTheirs, 1))
			},
			want: faultInProgress,
		},
		{
			name: "record vanished (released) before the read: claimed again and executed, 201",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFindsNothing()
				h.executedUntilCommit()
				h.commits()
			},
			want: faultCreated,
		},
		{
			name: "record vanishes on every round: gives up with 503, handler not run",
			script: func(h *faultHarness) {
				for range 4 { // the middleware's claim rounds
					h.claimTaken()
					h.lookupFindsNothing()
				}
			},
			want: faultStoreUnavailable,
		},
	})
}

func TestFault_TakeOver_ExpiredLeaseExecutesOnceAndFailuresNeverExecute(t *testing.T) {
	t.Parallel()
	expiredLease := faultProcessing(faultTheirs, 1)
	expiredLease.leaseExpired = true
	expiredRecord := faultDoneByThem(2)
	expiredRecord.expired = true

	runFaultCases(t, []faultCase{
		{
			name: "PROCESSING with an expired lease and the same fingerprint: taken over, executed at version 2, 201",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFinds(expiredLease)
				h.expectTakeOver(faultTheirs, 1).WillReturnResult(faultAffected1)
				h.begin()
				h.orderInserted()
				h.expectFinishDone(2).WillReturnResult(faultAffected1)
				h.commits()
			},
			want: faultCreated,
		},
		{
			name: "DONE past its retention: the key is new again, taken over and executed, 201",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFinds(expiredRecord)
				h.expectTakeOver(faultTheirs, 2).WillReturnResult(faultAffected1)
				h.begin()
				h.orderInserted()
				h.expectFinishDone(3).WillReturnResult(faultAffected1)
				h.commits()
			},
			want: faultCreated,
		},
		{
			name: "expired lease but a different fingerprint: 409 key-reused, no takeover",
			script: func(h *faultHarness) {
				h.claimTaken()
				r := expiredLease
				r.fingerprint = "another request"
				h.lookupFinds(r)
			},
			want: faultKeyReused,
		},
		{
			name: "takeover UPDATE fails: 503, handler not run",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFinds(expiredLease)
				h.expectTakeOver(faultTheirs, 1).WillReturnError(errFaultStoreDown)
			},
			want: faultStoreUnavailable,
		},
		{
			name: "takeover matches no row (another duplicate won): re-read shows its PROCESSING, 409 in-progress",
			script: func(h *faultHarness) {
				h.claimTaken()
				h.lookupFinds(expiredLease)
				h.expectTakeOver(faultTheirs, 1).WillReturnResult(faultAffected0)
				h.claimTaken()
				h.lookupFinds(faultProcessing(faultTheirs, 2))
			},
			want: faultInProgress,
		},
	})
}

// ---------------------------------------------------------------------------
// 6. BEGIN.

func TestFault_BeginFails_ReleasesTheClaimAndAnswers503(t *testing.T) {
	t.Parallel()
	notRun := faultReleasedAfterExecuting.ran(false)
	runFaultCases(t, []faultCase{
		{
			name: "BEGIN fails: DELETE releases the claim, 503 store-unavailable, handler not run",
			script: func(h *faultHarness) {
				h.claimed()
				h.expectBegin().WillReturnError(errFaultStoreDown)
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: notRun,
		},
		{
			name: "BEGIN and the release both fail: still 503, handler not run",
			script: func(h *faultHarness) {
				h.claimed()
				h.expectBegin().WillReturnError(errFaultStoreDown)
				h.expectRelease(1).WillReturnError(errFaultStoreDown)
			},
			want: notRun,
		},
	})
}

// ---------------------------------------------------------------------------
// 7, 14, 15. The handler fails.

func TestFault_HandlerFails_RollsBackReleasesAndPassesThe500Through(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "business INSERT fails, handler answers 500: ROLLBACK, DELETE, the handler's 500",
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.expectOrderInsert().WillReturnError(errFaultStoreDown)
				h.rollsBack()
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: faultHandlerFailure,
		},
		{
			name: "release DELETE fails after the handler's 500: the client still gets the handler's 500",
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.expectOrderInsert().WillReturnError(errFaultStoreDown)
				h.rollsBack()
				h.expectRelease(1).WillReturnError(errFaultStoreDown)
			},
			want: faultHandlerFailure,
		},
		{
			name:    "handler panics after its INSERT: ROLLBACK, DELETE, 500 execution-failed",
			handler: faultPanicAfterInsert,
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.orderInserted()
				h.rollsBack()
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: faultHandlerPanicked,
		},
		{
			name:    "handler panics and the release fails: still 500 execution-failed",
			handler: faultPanicAfterInsert,
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.orderInserted()
				h.rollsBack()
				h.expectRelease(1).WillReturnError(errFaultStoreDown)
			},
			want: faultHandlerPanicked,
		},
	})
}

// ---------------------------------------------------------------------------
// 8–9. The finalize UPDATE inside the business transaction.

func TestFault_FinalizeFails_RollsBackReleasesAndNeverAnswers2xx(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "finalize UPDATE fails: ROLLBACK, DELETE, 503",
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.orderInserted()
				h.expectFinishDone(1).WillReturnError(errFaultStoreDown)
				h.rollsBack()
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: faultReleasedAfterExecuting,
		},
		{
			// InnoDB rolled the whole transaction back: retrying the UPDATE
			// alone would commit a snapshot without its order.
			name: "finalize UPDATE deadlocks: not retried inside the transaction; ROLLBACK, DELETE, 503",
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.orderInserted()
				h.expectFinishDone(1).WillReturnError(errFaultDeadlock)
				h.rollsBack()
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: faultReleasedAfterExecuting,
		},
	})
}

// MariaDB's 1020 (innodb_snapshot_isolation) rolled the whole transaction
// back. It is not taken for a lost lease on its word: the fenced release
// says whether the record is still ours.
func TestFault_FinalizeRecordChanged_IsCheckedAgainstTheRecordBeforeItCountsAsLost(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "1020 and the record is still ours: ROLLBACK, DELETE, 503 with Retry-After",
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.orderInserted()
				h.expectFinishDone(1).WillReturnError(errFaultRecordChanged)
				h.rollsBack()
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: faultReleasedAfterExecuting,
		},
		{
			name: "1020 and another attempt took the key over: ROLLBACK, DELETE matches nothing, SELECT, 409 in-progress",
			script: func(h *faultHarness) {
				h.claimed()
				h.begin()
				h.orderInserted()
				h.expectFinishDone(1).WillReturnError(errFaultRecordChanged)
				h.rollsBack()
				h.expectRelease(1).WillReturnResult(faultAffected0)
				h.lookupFinds(faultProcessing(faultTheirs, 2))
			},
			want: faultInProgress.ran(true),
		},
	})
}

func TestFault_FinalizeLeaseLost_RollsBackAndAnswersTheCurrentOwnersState(t *testing.T) {
	t.Parallel()
	leaseLost := func(finishErr error, now faultRow) func(h *faultHarness) {
		return func(h *faultHarness) {
			h.claimed()
			h.begin()
			h.orderInserted()
			if finishErr != nil {
				h.expectFinishDone(1).WillReturnError(finishErr)
			} else {
				h.expectFinishDone(1).WillReturnResult(faultAffected0)
			}
			h.rollsBack()
			if now.status == "" {
				h.lookupFindsNothing()
			} else {
				h.lookupFinds(now)
			}
		}
	}
	runFaultCases(t, []faultCase{
		{
			name:   "0 rows, another owner's PROCESSING: ROLLBACK, SELECT, 409 in-progress",
			script: leaseLost(nil, faultProcessing(faultTheirs, 2)),
			want:   faultInProgress.ran(true),
		},
		{
			name:   "0 rows, another attempt's DONE: ROLLBACK, SELECT, its snapshot replayed",
			script: leaseLost(nil, faultDoneByThem(3)),
			want:   faultReplayOf(faultOtherOrderBody, faultOtherLocation).ran(true),
		},
		{
			name:   "0 rows and the record is gone: ROLLBACK, 503 (nothing of ours committed)",
			script: leaseLost(nil, faultRow{}),
			want:   faultStoreUnavailable.ran(true),
		},
	})
}

// ---------------------------------------------------------------------------
// 10–12. COMMIT.

func TestFault_CommitServerError_OrderIsNeverReported2xx(t *testing.T) {
	t.Parallel()
	serverError := func(commitErr error) func(h *faultHarness) {
		return func(h *faultHarness) {
			h.executedUntilCommit()
			h.expectCommit().WillReturnError(commitErr)
			h.lookupFinds(faultProcessing(faultOurs, 1))
			h.expectRelease(1).WillReturnResult(faultAffected1)
		}
	}
	runFaultCases(t, []faultCase{
		{
			name:   "1180 during COMMIT, record still ours PROCESSING: DELETE, 503",
			script: serverError(errFaultCommitFailed),
			want:   faultReleasedAfterExecuting,
		},
		{
			name:   "deadlock at COMMIT, record still ours PROCESSING: DELETE, 503",
			script: serverError(errFaultDeadlock),
			want:   faultReleasedAfterExecuting,
		},
		{
			name: "server error and the re-read fails: 503 commit-outcome-unknown, no DELETE",
			script: func(h *faultHarness) {
				h.executedUntilCommit()
				h.expectCommit().WillReturnError(errFaultCommitFailed)
				h.lookupFails(errFaultStoreDown)
			},
			want: faultCommitUnknown,
		},
	})
}

// faultConnectionErrors are COMMIT failures without a server answer: the order may
// have committed.
var faultConnectionErrors = []struct {
	name string
	err  error
}{
	{"driver.ErrBadConn", driver.ErrBadConn},
	{"io.ErrUnexpectedEOF", io.ErrUnexpectedEOF},
	{"mysql.ErrInvalidConn", mysql.ErrInvalidConn},
}

func TestFault_CommitConnectionLost_CommittedOrderIsReported201(t *testing.T) {
	t.Parallel()
	var cases []faultCase
	for _, ce := range faultConnectionErrors {
		cases = append(cases, faultCase{
			name: ce.name + ": re-read shows DONE by our owner at version 2: 201 with the handler's body",
			script: func(h *faultHarness) {
				h.executedUntilCommit()
				h.expectCommit().WillReturnError(ce.err)
				h.lookupFinds(faultDoneByUs(2))
			},
			want: faultCreated,
		})
	}
	runFaultCases(t, cases)
}

func TestFault_CommitConnectionLost_OutcomeFromTheRecord(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "re-read shows our PROCESSING and the DELETE removes it: not committed, 503",
			script: func(h *faultHarness) {
				h.executedUntilCommit()
				h.expectCommit().WillReturnError(io.ErrUnexpectedEOF)
				h.lookupFinds(faultProcessing(faultOurs, 1))
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: faultReleasedAfterExecuting,
		},
		{
			name: "re-read shows another attempt's PROCESSING (ours was taken over): 409 in-progress",
			script: func(h *faultHarness) {
				h.executedUntilCommit()
				h.expectCommit().WillReturnError(io.ErrUnexpectedEOF)
				h.lookupFinds(faultProcessing(faultTheirs, 2)) // resolving the commit
				h.lookupFinds(faultProcessing(faultTheirs, 2)) // answering the current owner
			},
			want: faultInProgress.ran(true),
		},
	})
}

func TestFault_CommitConnectionLost_UnreadableOutcomeKeepsTheKeyClaimed(t *testing.T) {
	t.Parallel()
	var cases []faultCase
	for _, ce := range faultConnectionErrors {
		cases = append(cases, faultCase{
			name: ce.name + " and the re-read fails: 503 commit-outcome-unknown, no DELETE",
			script: func(h *faultHarness) {
				h.executedUntilCommit()
				h.expectCommit().WillReturnError(ce.err)
				h.lookupFails(errFaultStoreDown)
			},
			want: faultCommitUnknown,
		})
	}
	runFaultCases(t, cases)
}

// A COMMIT whose connection dropped may still be completing on the server
// (a slow fsync, a semi-sync replica ack, a client read timeout): the re-read
// can see our PROCESSING record just before the commit lands. The fenced
// DELETE then waits for the commit's row lock and matches nothing, because
// the row is DONE. Reporting failure then would deny a committed order.
func TestFault_CommitConnectionLost_InFlightCommitIsNeverReportedAsFailure(t *testing.T) {
	t.Parallel()
	runFaultCases(t, []faultCase{
		{
			name: "re-read shows our PROCESSING, DELETE matches nothing, record now DONE by us: 201",
			script: func(h *faultHarness) {
				h.executedUntilCommit()
				h.expectCommit().WillReturnError(io.ErrUnexpectedEOF)
				h.lookupFinds(faultProcessing(faultOurs, 1))
				h.expectRelease(1).WillReturnResult(faultAffected0)
				h.lookupFinds(faultDoneByUs(2))
			},
			want: func() faultWant {
				w := faultCreated
				w.replayMarkOptional = true
				w.outcome = "" // committed or replayed: either is true
				return w
			}(),
		},
		{
			name: "re-read shows our PROCESSING, DELETE fails: 503 commit-outcome-unknown, not 500",
			script: func(h *faultHarness) {
				h.executedUntilCommit()
				h.expectCommit().WillReturnError(io.ErrUnexpectedEOF)
				h.lookupFinds(faultProcessing(faultOurs, 1))
				h.expectRelease(1).WillReturnError(errFaultStoreDown)
			},
			want: faultCommitUnknown,
		},
	})
}

// ---------------------------------------------------------------------------
// 13. A business rejection (final non-2xx).

func TestFault_Rejection_IsStoredAsFailedAndAlwaysAnswered422(t *testing.T) {
	t.Parallel()
	rejectedBy := func(h *faultHarness) {
		h.claimed()
		h.begin()
		h.expectOrderInsert().WillReturnError(errFaultUnknownSKU)
		h.rollsBack()
	}
	runFaultCases(t, []faultCase{
		{
			name: "handler answers 422: ROLLBACK, FAILED stored in autocommit, 422",
			script: func(h *faultHarness) {
				rejectedBy(h)
				h.expectFinishFailed(1).WillReturnResult(faultAffected1)
			},
			want: faultRejected,
		},
		{
			name: "FAILED UPDATE fails: DELETE releases the key, the client still gets 422",
			script: func(h *faultHarness) {
				rejectedBy(h)
				h.expectFinishFailed(1).WillReturnError(errFaultStoreDown)
				h.expectRelease(1).WillReturnResult(faultAffected1)
			},
			want: faultRejected,
		},
		{
			name: "FAILED UPDATE and the DELETE both fail: the client still gets 422",
			script: func(h *faultHarness) {
				rejectedBy(h)
				h.expectFinishFailed(1).WillReturnError(errFaultStoreDown)
				h.expectRelease(1).WillReturnError(errFaultStoreDown)
			},
			want: faultRejected,
		},
		{
			name: "FAILED UPDATE matches nothing (lease lost): SELECT, 409 in-progress",
			script: func(h *faultHarness) {
				rejectedBy(h)
				h.expectFinishFailed(1).WillReturnResult(faultAffected0)
				h.lookupFinds(faultProcessing(faultTheirs, 2))
			},
			want: faultInProgress.ran(true),
		},
	})
}
