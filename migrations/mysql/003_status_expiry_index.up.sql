-- One secondary index instead of two. The lease index (status, locked_until)
-- gave every finished record the entry (status, NULL, scope, key): a random
-- position in the index for every create, which costs a disk read once the
-- table outgrows the buffer pool. (status, expires_at) grows at its right
-- edge for every status, serves purge (finished records by expiry) and the
-- reconciler (PROCESSING records, few by nature, filtered by locked_until),
-- and each insert maintains one secondary index less.
ALTER TABLE idempotency_record
  DROP INDEX idx_idempotency_record_lease,
  DROP INDEX idx_idempotency_record_expiry,
  ADD INDEX idx_idempotency_record_status_expiry (status, expires_at);
