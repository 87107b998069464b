ALTER TABLE idempotency_record
  DROP INDEX idx_idempotency_record_status_expiry,
  ADD INDEX idx_idempotency_record_lease (status, locked_until),
  ADD INDEX idx_idempotency_record_expiry (expires_at);
