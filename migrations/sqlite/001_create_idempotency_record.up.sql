-- Times are integer Unix microseconds, computed by SQLite's clock.
CREATE TABLE IF NOT EXISTS idempotency_record (
  scope               TEXT    NOT NULL,
  idempotency_key     TEXT    NOT NULL,
  request_fingerprint TEXT    NOT NULL,
  status              TEXT    NOT NULL,
  locked_by           TEXT    NOT NULL,
  lease_version       INTEGER NOT NULL,
  locked_until        INTEGER NULL,
  response_status     INTEGER NULL,
  response_headers    BLOB    NULL,
  response_body       BLOB    NULL,
  created_at          INTEGER NOT NULL,
  updated_at          INTEGER NOT NULL,
  expires_at          INTEGER NOT NULL,
  PRIMARY KEY (scope, idempotency_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idx_idempotency_record_lease ON idempotency_record (status, locked_until);
CREATE INDEX IF NOT EXISTS idx_idempotency_record_expiry ON idempotency_record (expires_at);
