DROP TABLE IF EXISTS purchase_order;
