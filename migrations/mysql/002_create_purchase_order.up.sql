-- The reference order table used by the order state machine (order.go).
-- UNIQUE (scope, idempotency_key) is the last line of defence: even if an
-- idempotency record were lost, the database rejects a second order for the
-- same key. Orders created without a key (NULL) are not constrained by it.
CREATE TABLE IF NOT EXISTS purchase_order (
  id               BIGINT         NOT NULL AUTO_INCREMENT,
  order_no         VARCHAR(64)    NOT NULL,
  scope            VARBINARY(255) NOT NULL,
  idempotency_key  VARBINARY(255) NULL,
  user_id          BIGINT         NOT NULL,
  sku_id           BIGINT         NOT NULL,
  quantity         INT            NOT NULL,
  coupon_id        BIGINT         NULL,
  unit_price_cents BIGINT         NOT NULL,
  discount_cents   BIGINT         NOT NULL,
  total_cents      BIGINT         NOT NULL,
  status           VARCHAR(16)    NOT NULL,
  created_at       DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at       DATETIME(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_purchase_order_no (order_no),
  UNIQUE KEY uk_purchase_order_idem (scope, idempotency_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
