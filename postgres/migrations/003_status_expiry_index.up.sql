-- The record table's one secondary index, as on MySQL and SQLite, whose
-- migration 003 replaced two older indexes with it; PostgreSQL never had
-- those, and the version is kept so that every dialect migrates through the
-- same steps. (status, expires_at) grows at its right edge for every status,
-- serves purge (final records by expiry) and the reconciler (PROCESSING
-- records, few by nature, filtered by locked_until).
CREATE INDEX IF NOT EXISTS idx_idempotency_record_status_expiry
  ON idempotency_record (status, expires_at);
