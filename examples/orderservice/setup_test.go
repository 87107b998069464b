package orderservice_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
)

// Setup runs at every start of the example server. On a seeded catalog it
// changes nothing (a redeemed coupon stays redeemed); a catalog missing rows
// gets them back.
func TestSetup_AgainOnASeededCatalog_ChangesNothing_AndCompletesAPartialOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testdb.MySQL(t)
	require.NoError(t, orderservice.Setup(ctx, db, "mysql"))
	count := func(query string) (n int) {
		t.Helper()
		require.NoError(t, db.QueryRow(query).Scan(&n))
		return n
	}
	wantSKUs := int(orderservice.LastSKU - orderservice.FirstSKU + 1)
	wantCoupons := int(orderservice.LastCoupon - orderservice.FirstCoupon + 1)
	require.Equal(t, wantSKUs, count("SELECT COUNT(*) FROM sku"))
	require.Equal(t, wantCoupons, count("SELECT COUNT(*) FROM coupon WHERE status = 'AVAILABLE'"))

	_, err := db.Exec("UPDATE coupon SET status = 'REDEEMED' WHERE id = ?", orderservice.FirstCoupon)
	require.NoError(t, err)
	require.NoError(t, orderservice.Setup(ctx, db, "mysql"))
	require.Equal(t, 1, count("SELECT COUNT(*) FROM coupon WHERE status = 'REDEEMED'"), "a restart keeps a redeemed coupon")

	_, err = db.Exec("DELETE FROM sku WHERE id = ?", orderservice.LastSKU)
	require.NoError(t, err)
	_, err = db.Exec("DELETE FROM coupon WHERE id = ?", orderservice.LastCoupon)
	require.NoError(t, err)
	require.NoError(t, orderservice.Setup(ctx, db, "mysql"))
	require.Equal(t, wantSKUs, count("SELECT COUNT(*) FROM sku"), "the missing SKU is seeded again")
	require.Equal(t, wantCoupons, count("SELECT COUNT(*) FROM coupon"), "the missing coupon is seeded again")
	require.Equal(t, 1, count("SELECT COUNT(*) FROM coupon WHERE status = 'REDEEMED'"))
}
