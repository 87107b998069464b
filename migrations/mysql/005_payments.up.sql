-- The payment state machine (order_payment.go). purchase_order gains the
-- order's currency (ISO 4217, upper case; existing orders, and orders
-- created without one, are CNY: the column's default, which a deployment
-- that sells in another currency changes with ALTER TABLE ... ALTER COLUMN
-- currency SET DEFAULT) and the user's cancel request, a fact of its own:
-- the order's status is derived from it and from the payment facts.
-- run if: SELECT COUNT(*) = 0 FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'purchase_order' AND column_name = 'currency'
ALTER TABLE purchase_order ADD COLUMN currency CHAR(3) NOT NULL DEFAULT 'CNY';
-- run if: SELECT COUNT(*) = 0 FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'purchase_order' AND column_name = 'cancel_requested'
ALTER TABLE purchase_order ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;

-- One row per provider payment: PENDING while only refunds have named it
-- (order, amount and currency unknown), SUCCEEDED once its success event
-- applied. A provider tells of refunds in two ways: one refund at a time
-- (refunded_sum_cents adds each distinct refund once) and the payment's
-- whole refunded amount so far (refunded_reported_cents keeps the largest
-- reported). Both may tell of the same money, so they never add up:
-- refunded_cents, what the order's state derives from, is the larger of
-- the two, never above amount_cents. events_applied counts the success and
-- the refunds and totals applied.
CREATE TABLE IF NOT EXISTS order_payment (
  provider       VARBINARY(32)  NOT NULL,
  payment_id     VARBINARY(255) NOT NULL,
  order_no       VARCHAR(64)    NULL,
  status         VARCHAR(16)    NOT NULL,
  amount_cents   BIGINT         NULL,
  currency       CHAR(3)        NULL,
  refunded_cents BIGINT         NOT NULL DEFAULT 0,
  refunded_sum_cents      BIGINT NOT NULL DEFAULT 0,
  refunded_reported_cents BIGINT NOT NULL DEFAULT 0,
  events_applied INT            NOT NULL DEFAULT 0,
  created_at     DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at     DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (provider, payment_id),
  KEY idx_order_payment_order (order_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Every verified provider event, once: the unique (provider, event_id)
-- makes a second delivery a no-op. outcome is APPLIED, PENDING (a refund
-- waiting for its payment's success), NOOP or ANOMALY (with its reason).
-- refund_id is the provider's id of the one refund a REFUNDED event tells
-- of (NULL for a success, a total, or a provider without refund ids): a
-- provider tells of one refund in several events, and only the first that
-- applies or waits counts (the others are NOOP). applied_refund_id is
-- refund_id while the event is APPLIED, so that the unique key
-- uk_payment_event_refund allows one applied event per refund; the state
-- machine checks it first under the payment's lock (order_payment.go), and
-- the key refuses what a write outside that protocol would double.
CREATE TABLE IF NOT EXISTS payment_event (
  id           BIGINT         NOT NULL AUTO_INCREMENT,
  provider     VARBINARY(32)  NOT NULL,
  event_id     VARBINARY(255) NOT NULL,
  kind         VARCHAR(16)    NOT NULL,
  payment_id   VARBINARY(255) NOT NULL,
  refund_id    VARBINARY(255) NULL,
  order_no     VARCHAR(64)    NULL,
  amount_cents BIGINT         NOT NULL,
  currency     CHAR(3)        NOT NULL,
  digest       VARBINARY(128) NOT NULL,
  outcome      VARCHAR(16)    NOT NULL,
  reason       VARCHAR(32)    NULL,
  created_at   DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  applied_refund_id VARBINARY(255) AS (CASE WHEN outcome = 'APPLIED' THEN refund_id END) VIRTUAL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_payment_event (provider, event_id),
  UNIQUE KEY uk_payment_event_refund (provider, applied_refund_id),
  KEY idx_payment_event_payment (provider, payment_id, outcome),
  KEY idx_payment_event_refund (provider, refund_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Verified events that could not apply, with the reason: kept, never
-- retried, listed for an operator (Orders.ListAnomalies).
CREATE TABLE IF NOT EXISTS payment_anomaly (
  id           BIGINT         NOT NULL AUTO_INCREMENT,
  provider     VARBINARY(32)  NOT NULL,
  event_id     VARBINARY(255) NOT NULL,
  kind         VARCHAR(16)    NOT NULL,
  payment_id   VARBINARY(255) NOT NULL,
  order_no     VARCHAR(64)    NULL,
  amount_cents BIGINT         NOT NULL,
  currency     CHAR(3)        NOT NULL,
  digest       VARBINARY(128) NOT NULL,
  reason       VARCHAR(32)    NOT NULL,
  created_at   DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_payment_anomaly (provider, event_id, digest, reason)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
