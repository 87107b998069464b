-- One secondary index instead of two; see the MySQL migration of the same
-- number for why (status, expires_at) serves both purge and the reconciler,
-- and for the order of the statements.
CREATE INDEX IF NOT EXISTS idx_idempotency_record_status_expiry ON idempotency_record (status, expires_at);
DROP INDEX IF EXISTS idx_idempotency_record_lease;
DROP INDEX IF EXISTS idx_idempotency_record_expiry;
