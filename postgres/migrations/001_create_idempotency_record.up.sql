-- One row per (scope, idempotency_key). The primary key is the uniqueness
-- guarantee that lets exactly one request claim a key. COLLATE "C" compares
-- byte by byte, so keys are case-sensitive ("abc" and "ABC" are two keys)
-- and no locale rule can make two keys equal. The CHECKs kept the bounds the
-- MySQL schema's VARBINARY lengths give until migration 004 dropped them for
-- what they cost every insert; the store checks those bounds in Go now.
--
-- Times are timestamptz and always come from the database's clock
-- (clock_timestamp(), never now(), which is the transaction's start).
-- response_headers is jsonb (an operator can query it); response_body is
-- bytea, replayed byte for byte.
CREATE TABLE IF NOT EXISTS idempotency_record (
  scope               text COLLATE "C" NOT NULL CHECK (octet_length(scope) <= 255),
  idempotency_key     text COLLATE "C" NOT NULL CHECK (octet_length(idempotency_key) <= 255),
  request_fingerprint text COLLATE "C" NOT NULL CHECK (octet_length(request_fingerprint) <= 128),
  status              text             NOT NULL CHECK (status IN ('PROCESSING', 'DONE', 'FAILED')),
  locked_by           text COLLATE "C" NOT NULL CHECK (octet_length(locked_by) <= 128),
  lease_version       bigint           NOT NULL,
  locked_until        timestamptz      NULL,
  response_status     smallint         NULL,
  response_headers    jsonb            NULL,
  response_body       bytea            NULL,
  created_at          timestamptz      NOT NULL,
  updated_at          timestamptz      NOT NULL,
  expires_at          timestamptz      NOT NULL,
  CONSTRAINT idempotency_record_pkey PRIMARY KEY (scope, idempotency_key)
);
