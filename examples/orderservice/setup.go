package orderservice

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/orderguard/idempotency/migrations"
)

//go:embed schema/*.sql
var schema embed.FS

// Setup applies the idempotency migrations of dialect ("mysql", "sqlite" or
// "postgres"), creates the catalog tables and seeds SKUs 20001–20100 and
// coupons 1–1000. It is safe to call on every start. The "postgres"
// migrations are registered by the postgres module: a program that calls
// Setup with it imports github.com/orderguard/idempotency/postgres.
func Setup(ctx context.Context, db *sql.DB, dialect string) error {
	st, err := dialectStatements(dialect)
	if err != nil {
		return err
	}
	if err := migrations.Apply(ctx, db, dialect); err != nil {
		return err
	}
	script, err := schema.ReadFile("schema/" + dialect + ".sql")
	if err != nil {
		return fmt.Errorf("orderservice: unknown dialect %q", dialect)
	}
	for _, stmt := range migrations.Statements(string(script)) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("orderservice: schema: %w", err)
		}
	}
	// A restart finds the catalog seeded: one query instead of 1,100
	// inserts that would change nothing (a seed never resets a row).
	var skus, coupons int64
	if err := db.QueryRowContext(ctx, fmt.Sprintf(
		"SELECT (SELECT COUNT(*) FROM sku WHERE id BETWEEN %d AND %d), (SELECT COUNT(*) FROM coupon WHERE id BETWEEN %d AND %d)",
		FirstSKU, LastSKU, FirstCoupon, LastCoupon)).Scan(&skus, &coupons); err != nil {
		return fmt.Errorf("orderservice: count catalog: %w", err)
	}
	if skus == LastSKU-FirstSKU+1 && coupons == LastCoupon-FirstCoupon+1 {
		return nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	for id := int64(FirstSKU); id <= LastSKU; id++ {
		if _, err := tx.ExecContext(ctx, st.seedSKU, id, fmt.Sprintf("SKU %d", id), SKUPriceCents(id)); err != nil {
			return fmt.Errorf("orderservice: seed sku: %w", err)
		}
	}
	for id := int64(FirstCoupon); id <= LastCoupon; id++ {
		if _, err := tx.ExecContext(ctx, st.seedCoupon, id, CouponDiscountCents); err != nil {
			return fmt.Errorf("orderservice: seed coupon: %w", err)
		}
	}
	return tx.Commit()
}
