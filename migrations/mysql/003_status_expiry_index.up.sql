-- One secondary index instead of two. The lease index (status, locked_until)
-- gave every finished record the entry (status, NULL, scope, key): a random
-- position in the index for every create, which costs a disk read once the
-- table outgrows the buffer pool. (status, expires_at) grows at its right
-- edge for every status, serves purge (finished records by expiry) and the
-- reconciler (PROCESSING records, few by nature, filtered by locked_until),
-- and each insert maintains one secondary index less.
--
-- One index change per statement, each guarded, because MySQL 8 has no
-- IF [NOT] EXISTS for them in ALTER TABLE: a crash between two statements
-- leaves a state the next run completes (see the package doc). The new
-- index comes first, so that purge and the reconciler have an index at every
-- point in between. Dropping an index changes only metadata in InnoDB, so
-- three ALTERs cost about what the one did.
-- run if: SELECT COUNT(*) = 0 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'idempotency_record' AND index_name = 'idx_idempotency_record_status_expiry'
ALTER TABLE idempotency_record ADD INDEX idx_idempotency_record_status_expiry (status, expires_at);
-- run if: SELECT COUNT(*) > 0 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'idempotency_record' AND index_name = 'idx_idempotency_record_lease'
ALTER TABLE idempotency_record DROP INDEX idx_idempotency_record_lease;
-- run if: SELECT COUNT(*) > 0 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'idempotency_record' AND index_name = 'idx_idempotency_record_expiry'
ALTER TABLE idempotency_record DROP INDEX idx_idempotency_record_expiry;
