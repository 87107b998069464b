CREATE TABLE IF NOT EXISTS sku (
  id          INTEGER NOT NULL PRIMARY KEY,
  name        TEXT    NOT NULL,
  price_cents INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS coupon (
  id             INTEGER NOT NULL PRIMARY KEY,
  discount_cents INTEGER NOT NULL,
  status         TEXT    NOT NULL,
  updated_at     TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP
);
