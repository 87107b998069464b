-- Restores 001's CHECK constraints, each guarded: ADD CONSTRAINT has no IF
-- NOT EXISTS. Each validates the whole table.
-- run if: SELECT (COUNT(*) = 0)::int FROM pg_constraint WHERE conrelid = 'idempotency_record'::regclass AND conname = 'idempotency_record_scope_check'
ALTER TABLE idempotency_record ADD CONSTRAINT idempotency_record_scope_check CHECK (octet_length(scope) <= 255);
-- run if: SELECT (COUNT(*) = 0)::int FROM pg_constraint WHERE conrelid = 'idempotency_record'::regclass AND conname = 'idempotency_record_idempotency_key_check'
ALTER TABLE idempotency_record ADD CONSTRAINT idempotency_record_idempotency_key_check CHECK (octet_length(idempotency_key) <= 255);
-- run if: SELECT (COUNT(*) = 0)::int FROM pg_constraint WHERE conrelid = 'idempotency_record'::regclass AND conname = 'idempotency_record_request_fingerprint_check'
ALTER TABLE idempotency_record ADD CONSTRAINT idempotency_record_request_fingerprint_check CHECK (octet_length(request_fingerprint) <= 128);
-- run if: SELECT (COUNT(*) = 0)::int FROM pg_constraint WHERE conrelid = 'idempotency_record'::regclass AND conname = 'idempotency_record_status_check'
ALTER TABLE idempotency_record ADD CONSTRAINT idempotency_record_status_check CHECK (status IN ('PROCESSING', 'DONE', 'FAILED'));
-- run if: SELECT (COUNT(*) = 0)::int FROM pg_constraint WHERE conrelid = 'idempotency_record'::regclass AND conname = 'idempotency_record_locked_by_check'
ALTER TABLE idempotency_record ADD CONSTRAINT idempotency_record_locked_by_check CHECK (octet_length(locked_by) <= 128);
