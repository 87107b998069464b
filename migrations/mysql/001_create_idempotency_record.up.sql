-- One row per (scope, idempotency_key). The primary key is the uniqueness
-- guarantee that lets exactly one request claim a key; binary collations keep
-- keys case-sensitive ("abc" and "ABC" are different keys).
CREATE TABLE IF NOT EXISTS idempotency_record (
  scope               VARBINARY(255) NOT NULL,
  idempotency_key     VARBINARY(255) NOT NULL,
  request_fingerprint VARBINARY(128) NOT NULL,
  status              VARCHAR(16)    NOT NULL,
  locked_by           VARBINARY(128) NOT NULL,
  lease_version       BIGINT         NOT NULL,
  locked_until        DATETIME(6)    NULL,
  response_status     SMALLINT       NULL,
  response_headers    BLOB           NULL,
  response_body       MEDIUMBLOB     NULL,
  created_at          DATETIME(6)    NOT NULL,
  updated_at          DATETIME(6)    NOT NULL,
  expires_at          DATETIME(6)    NOT NULL,
  PRIMARY KEY (scope, idempotency_key),
  KEY idx_idempotency_record_lease (status, locked_until),
  KEY idx_idempotency_record_expiry (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
