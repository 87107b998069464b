-- Back to the two indexes of 001, one guarded change per statement as in
-- the up migration, the old indexes first.
-- run if: SELECT COUNT(*) = 0 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'idempotency_record' AND index_name = 'idx_idempotency_record_lease'
ALTER TABLE idempotency_record ADD INDEX idx_idempotency_record_lease (status, locked_until);
-- run if: SELECT COUNT(*) = 0 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'idempotency_record' AND index_name = 'idx_idempotency_record_expiry'
ALTER TABLE idempotency_record ADD INDEX idx_idempotency_record_expiry (expires_at);
-- run if: SELECT COUNT(*) > 0 FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'idempotency_record' AND index_name = 'idx_idempotency_record_status_expiry'
ALTER TABLE idempotency_record DROP INDEX idx_idempotency_record_status_expiry;
