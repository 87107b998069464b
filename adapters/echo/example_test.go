package idemecho_test

import (
	"crypto/rand"
	"database/sql"
	"log"
	"net/http"

	_ "github.com/go-sql-driver/mysql"
	"github.com/labstack/echo/v4"

	"github.com/orderguard/idempotency"
	idemecho "github.com/orderguard/idempotency/adapters/echo"
)

// A create-order route: the handler runs at most once per key and
// fingerprint, in the request's transaction, and retries get the first answer
// back. (It needs a MySQL server, so it only compiles.)
func Example() {
	db, err := sql.Open("mysql", "app@tcp(db:3306)/shop?interpolateParams=true&parseTime=true")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Route:       "create_order",
		ScopeFunc:   func(r *http.Request) (string, error) { return r.Header.Get("X-User-ID"), nil }, // use your authenticated user id
		Fingerprint: idempotency.FingerprintConfig{Fields: []string{"sku_id", "quantity"}},
	})
	if err != nil {
		log.Fatal(err)
	}

	e := echo.New()
	e.POST("/orders", func(c echo.Context) error {
		var req struct {
			SKUID    int64 `json:"sku_id"`
			Quantity int   `json:"quantity"`
		}
		if err := c.Bind(&req); err != nil {
			return err // 400 is not stored: a corrected retry executes
		}
		ctx := c.Request().Context()
		tx, _ := idempotency.TxFromContext(ctx) // every write in tx; never commit it
		scope, key, _ := idempotency.KeyFromContext(ctx)
		order := &idempotency.Order{OrderNo: "O" + rand.Text(), Scope: scope, IdempotencyKey: key, SKUID: req.SKUID, Quantity: req.Quantity}
		if err := idempotency.CreateOrder(ctx, tx, order); err != nil {
			return err // echo's 500: rolled back, key released
		}
		c.Response().Header().Set("Location", "/orders/"+order.OrderNo)
		return c.JSON(http.StatusCreated, map[string]string{"order_no": order.OrderNo}) // committed with the snapshot, then sent
	}, idemecho.Middleware(mw))
	_ = e.Start("127.0.0.1:8080")
}
