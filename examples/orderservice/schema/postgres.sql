CREATE TABLE IF NOT EXISTS sku (
  id          bigint NOT NULL PRIMARY KEY,
  name        text   NOT NULL,
  price_cents bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS coupon (
  id             bigint      NOT NULL PRIMARY KEY,
  discount_cents bigint      NOT NULL,
  status         text        NOT NULL,
  updated_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
