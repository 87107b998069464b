-- The payment state machine (order_payment.go); see the MySQL migration of
-- the same number for what each table and column holds. Existing orders,
-- and orders created without a currency, are CNY.
-- run if: SELECT COUNT(*) = 0 FROM pragma_table_info('purchase_order') WHERE name = 'currency'
ALTER TABLE purchase_order ADD COLUMN currency TEXT NOT NULL DEFAULT 'CNY';
-- run if: SELECT COUNT(*) = 0 FROM pragma_table_info('purchase_order') WHERE name = 'cancel_requested'
ALTER TABLE purchase_order ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS order_payment (
  provider       TEXT    NOT NULL,
  payment_id     TEXT    NOT NULL,
  order_no       TEXT    NULL,
  status         TEXT    NOT NULL,
  amount_cents   INTEGER NULL,
  currency       TEXT    NULL,
  refunded_cents INTEGER NOT NULL DEFAULT 0,
  refunded_sum_cents      INTEGER NOT NULL DEFAULT 0,
  refunded_reported_cents INTEGER NOT NULL DEFAULT 0,
  events_applied INTEGER NOT NULL DEFAULT 0,
  created_at     TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at     TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (provider, payment_id)
);
CREATE INDEX IF NOT EXISTS idx_order_payment_order ON order_payment (order_no);
CREATE TABLE IF NOT EXISTS payment_event (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  provider     TEXT    NOT NULL,
  event_id     TEXT    NOT NULL,
  kind         TEXT    NOT NULL,
  payment_id   TEXT    NOT NULL,
  refund_id    TEXT    NULL,
  order_no     TEXT    NULL,
  amount_cents INTEGER NOT NULL,
  currency     TEXT    NOT NULL,
  digest       TEXT    NOT NULL,
  outcome      TEXT    NOT NULL,
  reason       TEXT    NULL,
  created_at   TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  UNIQUE (provider, event_id)
);
CREATE INDEX IF NOT EXISTS idx_payment_event_payment ON payment_event (provider, payment_id, outcome);
CREATE INDEX IF NOT EXISTS idx_payment_event_refund ON payment_event (provider, refund_id);
-- One applied event per refund (see refund_id in the MySQL migration).
CREATE UNIQUE INDEX IF NOT EXISTS uk_payment_event_refund ON payment_event (provider, refund_id) WHERE outcome = 'APPLIED';
CREATE TABLE IF NOT EXISTS payment_anomaly (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  provider     TEXT    NOT NULL,
  event_id     TEXT    NOT NULL,
  kind         TEXT    NOT NULL,
  payment_id   TEXT    NOT NULL,
  order_no     TEXT    NULL,
  amount_cents INTEGER NOT NULL,
  currency     TEXT    NOT NULL,
  digest       TEXT    NOT NULL,
  reason       TEXT    NOT NULL,
  created_at   TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  UNIQUE (provider, event_id, digest, reason)
);
