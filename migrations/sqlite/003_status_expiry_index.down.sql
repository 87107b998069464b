CREATE INDEX IF NOT EXISTS idx_idempotency_record_lease ON idempotency_record (status, locked_until);
CREATE INDEX IF NOT EXISTS idx_idempotency_record_expiry ON idempotency_record (expires_at);
DROP INDEX IF EXISTS idx_idempotency_record_status_expiry;
