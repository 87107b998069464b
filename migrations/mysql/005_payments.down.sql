DROP TABLE IF EXISTS payment_anomaly;
DROP TABLE IF EXISTS payment_event;
DROP TABLE IF EXISTS order_payment;
-- run if: SELECT COUNT(*) > 0 FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'purchase_order' AND column_name = 'cancel_requested'
ALTER TABLE purchase_order DROP COLUMN cancel_requested;
-- run if: SELECT COUNT(*) > 0 FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'purchase_order' AND column_name = 'currency'
ALTER TABLE purchase_order DROP COLUMN currency;
