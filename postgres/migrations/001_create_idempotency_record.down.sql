DROP TABLE IF EXISTS idempotency_record;
