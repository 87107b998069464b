DROP TABLE IF EXISTS payment_anomaly;
DROP TABLE IF EXISTS payment_event;
DROP TABLE IF EXISTS order_payment;
-- run if: SELECT COUNT(*) > 0 FROM pragma_table_info('purchase_order') WHERE name = 'cancel_requested'
ALTER TABLE purchase_order DROP COLUMN cancel_requested;
-- run if: SELECT COUNT(*) > 0 FROM pragma_table_info('purchase_order') WHERE name = 'currency'
ALTER TABLE purchase_order DROP COLUMN currency;
