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
-- applied. refunded_cents is the sum of its applied refunds, never above
-- amount_cents; events_applied counts the success and the refunds applied.
CREATE TABLE IF NOT EXISTS order_payment (
  provider       VARBINARY(32)  NOT NULL,
  payment_id     VARBINARY(255) NOT NULL,
  order_no       VARCHAR(64)    NULL,
  status         VARCHAR(16)    NOT NULL,
  amount_cents   BIGINT         NULL,
  currency       CHAR(3)        NULL,
  refunded_cents BIGINT         NOT NULL DEFAULT 0,
  events_applied INT            NOT NULL DEFAULT 0,
  created_at     DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at     DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (provider, payment_id),
  KEY idx_order_payment_order (order_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Every verified provider event, once: the unique (provider, event_id)
-- makes a second delivery a no-op. outcome is APPLIED, PENDING (a refund
-- waiting for its payment's success), NOOP or ANOMALY (with its reason).
CREATE TABLE IF NOT EXISTS payment_event (
  id           BIGINT         NOT NULL AUTO_INCREMENT,
  provider     VARBINARY(32)  NOT NULL,
  event_id     VARBINARY(255) NOT NULL,
  kind         VARCHAR(16)    NOT NULL,
  payment_id   VARBINARY(255) NOT NULL,
  order_no     VARCHAR(64)    NULL,
  amount_cents BIGINT         NOT NULL,
  currency     CHAR(3)        NOT NULL,
  digest       VARBINARY(128) NOT NULL,
  outcome      VARCHAR(16)    NOT NULL,
  reason       VARCHAR(32)    NULL,
  created_at   DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_payment_event (provider, event_id),
  KEY idx_payment_event_payment (provider, payment_id, outcome)
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
