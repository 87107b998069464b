package idempotency

import (
	"strings"
)

// The payment state machine's SQL, written by hand for each dialect; the
// design is in order_payment.go.

// PaymentStatements is the SQL of the payment state machine in one dialect,
// a field of Orders. Placeholders are ? or $n; the parameters are listed in
// order.
type PaymentStatements struct {
	// InsertEvent records an event, claiming its (provider, event_id).
	// Parameters: provider, event_id, kind, payment_id, refund_id (or
	// NULL), order_no (or NULL), amount_cents, currency, digest, outcome
	// (the event's outcome as far as it is known before the claim). A
	// duplicate either fails with a unique violation or inserts no row.
	InsertEvent string
	// SelectEvent reads a recorded event as the latest committed version
	// (a locking read on MySQL). Parameters: provider, event_id. Columns:
	// kind, payment_id, order_no, digest, outcome, reason.
	SelectEvent string
	// UpdateEventOutcome sets an event's outcome. Parameters: outcome,
	// reason (or NULL), order_no (or NULL), provider, event_id.
	UpdateEventOutcome string
	// InsertAnomaly records an event that could not apply, once per
	// (provider, event_id, digest, reason). Parameters: provider, event_id,
	// kind, payment_id, order_no (or NULL), amount_cents, currency, digest,
	// reason.
	InsertAnomaly string
	// LockOrder locks an order row and reads its facts. Parameter:
	// order_no. Columns: status, cancel_requested, total_cents, currency.
	LockOrder string
	// UpdateOrderFacts moves an order to its derived state, guarded by the
	// state read under the lock. Parameters: status, cancel_requested,
	// order_no, the status read.
	UpdateOrderFacts string
	// SelectPaymentOrder reads a payment's order number without a lock.
	// Parameters: provider, payment_id. Column: order_no (NULL while
	// pending).
	SelectPaymentOrder string
	// InsertPendingPayment creates a PENDING payment unless it exists.
	// Parameters: provider, payment_id.
	InsertPendingPayment string
	// InsertSettledPayment inserts a payment settled by its success alone
	// (events_applied 1, nothing refunded) unless its row exists, and says
	// which by RowsAffected: 1 for the insert, anything else for a row
	// that exists, whose facts it leaves as they are and which it locks or
	// waits for. On MySQL the duplicate's update always changes the row (it
	// moves updated_at forward, at least by a microsecond), so that
	// RowsAffected is 2 with or without the driver's clientFoundRows, and
	// takes the row's exclusive lock at once: a duplicate of a plain
	// INSERT would take a shared lock, and raising it to exclusive while a
	// refund waits for the row deadlocks. Parameters: provider, payment_id,
	// order_no, amount_cents, currency. Empty: a success always takes the
	// locking path (InsertPendingPayment, LockPayment, SettlePayment).
	InsertSettledPayment string
	// LockPayment locks a payment row and reads it. Parameters: provider,
	// payment_id. Columns: Payment's fields from OrderNo on.
	LockPayment string
	// SelectPayment reads a payment without a lock, as LockPayment.
	SelectPayment string
	// SettlePayment settles a pending payment. Parameters: order_no,
	// amount_cents, currency, refunded_cents, refunded_sum_cents,
	// refunded_reported_cents, events_applied, provider, payment_id.
	SettlePayment string
	// UpdatePaymentRefund sets a settled payment's refunded amounts,
	// guarded by the events_applied read under the lock (every write of a
	// payment raises it). Parameters: refunded_cents, refunded_sum_cents,
	// refunded_reported_cents, events_applied, provider, payment_id, the
	// events_applied read.
	UpdatePaymentRefund string
	// SelectOrderPayments reads the settled payments of an order with a
	// shared lock (their latest committed version). Parameter: order_no.
	// Columns: provider, payment_id, amount_cents, refunded_cents.
	SelectOrderPayments string
	// SelectPendingRefunds locks the refunds waiting for a payment, in
	// arrival order. Parameters: provider, payment_id. Columns: event_id,
	// refund_id, order_no, kind, amount_cents, currency, digest.
	SelectPendingRefunds string
	// SelectRefundTold reads another event of the same refund that applied
	// or waits, as the latest committed version (a locking read on MySQL),
	// under the lock of the refund's payment. Parameters: provider,
	// refund_id, the event_id to leave out. Column: event_id; no row when
	// the refund is new.
	SelectRefundTold string
	// ListAnomalies lists the recorded anomalies and the refunds owed,
	// newest first. Parameter: the limit. Columns: PaymentAnomaly's fields
	// in order.
	ListAnomalies string
}

var mysqlPayments = PaymentStatements{
	InsertEvent: `INSERT INTO payment_event
  (provider, event_id, kind, payment_id, refund_id, order_no, amount_cents, currency, digest, outcome)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	SelectEvent:        `SELECT kind, payment_id, order_no, digest, outcome, reason FROM payment_event WHERE provider = ? AND event_id = ? LOCK IN SHARE MODE`,
	UpdateEventOutcome: `UPDATE payment_event SET outcome = ?, reason = ?, order_no = COALESCE(order_no, ?) WHERE provider = ? AND event_id = ?`,
	InsertAnomaly: `INSERT INTO payment_anomaly
  (provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, reason)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE id = id`,
	LockOrder:            `SELECT status, cancel_requested, total_cents, currency FROM purchase_order WHERE order_no = ? FOR UPDATE`,
	UpdateOrderFacts:     `UPDATE purchase_order SET status = ?, cancel_requested = ?, updated_at = CURRENT_TIMESTAMP(6) WHERE order_no = ? AND status = ?`,
	SelectPaymentOrder:   `SELECT order_no FROM order_payment WHERE provider = ? AND payment_id = ?`,
	InsertPendingPayment: `INSERT INTO order_payment (provider, payment_id, status) VALUES (?, ?, 'PENDING') ON DUPLICATE KEY UPDATE provider = provider`,
	InsertSettledPayment: `INSERT INTO order_payment (provider, payment_id, order_no, status, amount_cents, currency, events_applied)
VALUES (?, ?, ?, 'SUCCEEDED', ?, ?, 1)
ON DUPLICATE KEY UPDATE updated_at = GREATEST(CURRENT_TIMESTAMP(6), updated_at + INTERVAL 1 MICROSECOND)`,
	LockPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = ? AND payment_id = ? FOR UPDATE`,
	SelectPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = ? AND payment_id = ?`,
	SettlePayment: `UPDATE order_payment SET status = 'SUCCEEDED', order_no = ?, amount_cents = ?, currency = ?,
  refunded_cents = ?, refunded_sum_cents = ?, refunded_reported_cents = ?, events_applied = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE provider = ? AND payment_id = ? AND status = 'PENDING'`,
	UpdatePaymentRefund: `UPDATE order_payment SET refunded_cents = ?, refunded_sum_cents = ?, refunded_reported_cents = ?,
  events_applied = ?, updated_at = CURRENT_TIMESTAMP(6)
WHERE provider = ? AND payment_id = ? AND status = 'SUCCEEDED' AND events_applied = ?`,
	SelectOrderPayments: `SELECT provider, payment_id, amount_cents, refunded_cents FROM order_payment
WHERE order_no = ? AND status = 'SUCCEEDED' ORDER BY provider, payment_id LOCK IN SHARE MODE`,
	SelectPendingRefunds: `SELECT event_id, refund_id, order_no, kind, amount_cents, currency, digest FROM payment_event
WHERE provider = ? AND payment_id = ? AND outcome = 'PENDING' AND kind IN ('REFUNDED', 'REFUNDED_TOTAL') ORDER BY id FOR UPDATE`,
	SelectRefundTold: `SELECT event_id FROM payment_event
WHERE provider = ? AND refund_id = ? AND outcome IN ('APPLIED', 'PENDING') AND event_id <> ? LIMIT 1 LOCK IN SHARE MODE`,
	ListAnomalies: `SELECT reason, provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, at FROM (
  SELECT a.reason, a.provider, a.event_id, a.kind, a.payment_id, a.order_no, a.amount_cents, a.currency, a.digest, a.created_at AS at
  FROM payment_anomaly a
  UNION ALL
  SELECT 'refund-owed', p.provider, COALESCE(e.event_id, ''), 'SUCCEEDED', p.payment_id, p.order_no,
    p.amount_cents - p.refunded_cents, p.currency, COALESCE(e.digest, ''), o.updated_at
  FROM order_payment p
  JOIN purchase_order o ON o.order_no = p.order_no
  LEFT JOIN payment_event e ON e.provider = p.provider AND e.payment_id = p.payment_id
    AND e.kind = 'SUCCEEDED' AND e.outcome = 'APPLIED'
  WHERE p.status = 'SUCCEEDED' AND o.status = 'CANCELED' AND p.refunded_cents < p.amount_cents
) x ORDER BY at DESC, provider, event_id, payment_id, reason LIMIT ?`,
}

var postgresPayments = PaymentStatements{
	InsertEvent: `INSERT INTO payment_event
  (provider, event_id, kind, payment_id, refund_id, order_no, amount_cents, currency, digest, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (provider, event_id) DO NOTHING`,
	SelectEvent:        `SELECT kind, payment_id, order_no, digest, outcome, reason FROM payment_event WHERE provider = $1 AND event_id = $2`,
	UpdateEventOutcome: `UPDATE payment_event SET outcome = $1, reason = $2, order_no = COALESCE(order_no, $3) WHERE provider = $4 AND event_id = $5`,
	InsertAnomaly: `INSERT INTO payment_anomaly
  (provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (provider, event_id, digest, reason) DO NOTHING`,
	LockOrder:            `SELECT status, cancel_requested, total_cents, currency FROM purchase_order WHERE order_no = $1 FOR UPDATE`,
	UpdateOrderFacts:     `UPDATE purchase_order SET status = $1, cancel_requested = $2, updated_at = clock_timestamp() WHERE order_no = $3 AND status = $4`,
	SelectPaymentOrder:   `SELECT order_no FROM order_payment WHERE provider = $1 AND payment_id = $2`,
	InsertPendingPayment: `INSERT INTO order_payment (provider, payment_id, status) VALUES ($1, $2, 'PENDING') ON CONFLICT (provider, payment_id) DO NOTHING`,
	InsertSettledPayment: `INSERT INTO order_payment (provider, payment_id, order_no, status, amount_cents, currency, events_applied)
VALUES ($1, $2, $3, 'SUCCEEDED', $4, $5, 1)
ON CONFLICT (provider, payment_id) DO NOTHING`,
	LockPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = $1 AND payment_id = $2 FOR UPDATE`,
	SelectPayment: `SELECT order_no, status, amount_cents, currency, refunded_cents, refunded_sum_cents, refunded_reported_cents, events_applied
FROM order_payment WHERE provider = $1 AND payment_id = $2`,
	SettlePayment: `UPDATE order_payment SET status = 'SUCCEEDED', order_no = $1, amount_cents = $2, currency = $3,
  refunded_cents = $4, refunded_sum_cents = $5, refunded_reported_cents = $6, events_applied = $7, updated_at = clock_timestamp()
WHERE provider = $8 AND payment_id = $9 AND status = 'PENDING'`,
	UpdatePaymentRefund: `UPDATE order_payment SET refunded_cents = $1, refunded_sum_cents = $2, refunded_reported_cents = $3,
  events_applied = $4, updated_at = clock_timestamp()
WHERE provider = $5 AND payment_id = $6 AND status = 'SUCCEEDED' AND events_applied = $7`,
	SelectOrderPayments: `SELECT provider, payment_id, amount_cents, refunded_cents FROM order_payment
WHERE order_no = $1 AND status = 'SUCCEEDED' ORDER BY provider, payment_id FOR SHARE`,
	SelectPendingRefunds: `SELECT event_id, refund_id, order_no, kind, amount_cents, currency, digest FROM payment_event
WHERE provider = $1 AND payment_id = $2 AND outcome = 'PENDING' AND kind IN ('REFUNDED', 'REFUNDED_TOTAL') ORDER BY id FOR UPDATE`,
	SelectRefundTold: `SELECT event_id FROM payment_event
WHERE provider = $1 AND refund_id = $2 AND outcome IN ('APPLIED', 'PENDING') AND event_id <> $3 LIMIT 1`,
	ListAnomalies: `SELECT reason, provider, event_id, kind, payment_id, order_no, amount_cents, currency, digest, at FROM (
  SELECT a.reason, a.provider, a.event_id, a.kind, a.payment_id, a.order_no, a.amount_cents, a.currency, a.digest, a.created_at AS at
  FROM payment_anomaly a
  UNION ALL
  SELECT 'refund-owed', p.provider, COALESCE(e.event_id, ''), 'SUCCEEDED', p.payment_id, p.order_no,
    p.amount_cents - p.refunded_cents, p.currency, COALESCE(e.digest, ''), o.updated_at
  FROM order_payment p
  JOIN purchase_order o ON o.order_no = p.order_no
  LEFT JOIN payment_event e ON e.provider = p.provider AND e.payment_id = p.payment_id
    AND e.kind = 'SUCCEEDED' AND e.outcome = 'APPLIED'
  WHERE p.status = 'SUCCEEDED' AND o.status = 'CANCELED' AND p.refunded_cents < p.amount_cents
) x ORDER BY at DESC, provider, event_id, payment_id, reason LIMIT $1`,
}

// sqlitePayments is mysqlPayments without locking clauses, which SQLite
// does not have and does not need: its transactions begin IMMEDIATE (package
// sqlite's Open) and hold the database's write lock throughout.
var sqlitePayments = func() PaymentStatements {
	p := mysqlPayments
	for _, f := range []*string{&p.SelectEvent, &p.LockOrder, &p.LockPayment, &p.SelectOrderPayments, &p.SelectPendingRefunds, &p.SelectRefundTold} {
		*f = strings.TrimSuffix(strings.TrimSuffix(*f, " LOCK IN SHARE MODE"), " FOR UPDATE")
	}
	p.InsertAnomaly = strings.Replace(p.InsertAnomaly, "ON DUPLICATE KEY UPDATE id = id", "ON CONFLICT (provider, event_id, digest, reason) DO NOTHING", 1)
	p.InsertPendingPayment = strings.Replace(p.InsertPendingPayment, "ON DUPLICATE KEY UPDATE provider = provider", "ON CONFLICT (provider, payment_id) DO NOTHING", 1)
	p.InsertSettledPayment = p.InsertSettledPayment[:strings.Index(p.InsertSettledPayment, "ON DUPLICATE KEY UPDATE")] + "ON CONFLICT (provider, payment_id) DO NOTHING"
	p.UpdateOrderFacts = strings.Replace(p.UpdateOrderFacts, "CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP", 1)
	p.SettlePayment = strings.Replace(p.SettlePayment, "CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP", 1)
	p.UpdatePaymentRefund = strings.Replace(p.UpdatePaymentRefund, "CURRENT_TIMESTAMP(6)", "CURRENT_TIMESTAMP", 1)
	return p
}()

// SQLiteOrders is the order SQL of SQLite: MySQLOrders' order statements,
// which SQLite runs as they are, and the payment statements without the
// locking clauses SQLite lacks (package sqlite's transactions hold the
// write lock from BEGIN).
var SQLiteOrders = func() Orders {
	o := MySQLOrders
	o.Payments = sqlitePayments
	return o
}()
