CREATE TABLE IF NOT EXISTS purchase_order (
  id               INTEGER PRIMARY KEY AUTOINCREMENT,
  order_no         TEXT    NOT NULL UNIQUE,
  scope            TEXT    NOT NULL,
  idempotency_key  TEXT    NULL,
  user_id          INTEGER NOT NULL,
  sku_id           INTEGER NOT NULL,
  quantity         INTEGER NOT NULL,
  coupon_id        INTEGER NULL,
  unit_price_cents INTEGER NOT NULL,
  discount_cents   INTEGER NOT NULL,
  total_cents      INTEGER NOT NULL,
  status           TEXT    NOT NULL,
  created_at       TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  updated_at       TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP,
  UNIQUE (scope, idempotency_key)
);
