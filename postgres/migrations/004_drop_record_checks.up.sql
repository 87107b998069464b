-- Drops the record table's CHECK constraints (migration 001). PostgreSQL
-- re-reads and re-plans every CHECK of a table from its stored text at the
-- start of each INSERT or UPDATE statement: measured with callgrind on
-- PostgreSQL 15, the five cost about 106,000 instructions per record insert,
-- half of what single-phase's record adds to a create. The bounds they kept
-- are checked before any statement instead: the middleware refuses a key,
-- scope or fingerprint out of bounds with a 400 or 401 and writes nothing,
-- Config refuses an InstanceID that would not fit locked_by, and the SQL
-- store refuses a Claim out of bounds on every dialect (ErrClaimOutOfBounds),
-- so nothing the library writes could have failed them. The status values
-- are the library's own constants.
--
-- The names are PostgreSQL's defaults for column constraints, which 001
-- left unnamed. Each statement is one change and idempotent by itself.
ALTER TABLE idempotency_record DROP CONSTRAINT IF EXISTS idempotency_record_scope_check;
ALTER TABLE idempotency_record DROP CONSTRAINT IF EXISTS idempotency_record_idempotency_key_check;
ALTER TABLE idempotency_record DROP CONSTRAINT IF EXISTS idempotency_record_request_fingerprint_check;
ALTER TABLE idempotency_record DROP CONSTRAINT IF EXISTS idempotency_record_status_check;
ALTER TABLE idempotency_record DROP CONSTRAINT IF EXISTS idempotency_record_locked_by_check;
