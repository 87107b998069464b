package idemgin_test

import (
	"crypto/rand"
	"database/sql"
	"log"
	"net/http"

	"github.com/gin-gonic/gin"
	_ "github.com/go-sql-driver/mysql"

	"github.com/orderguard/idempotency"
	idemgin "github.com/orderguard/idempotency/adapters/gin"
)

// A create-order route: the handler given to idemgin.Wrap runs at most once
// per key and fingerprint, in the request's transaction, and retries get the
// first answer back. Wrap works in either mode; this route is single-phase,
// as every effect of createOrderHandler is in the transaction.
// (It needs a MySQL server, so it only compiles.)
func Example() {
	db, err := sql.Open("mysql", "app@tcp(db:3306)/shop?interpolateParams=true&parseTime=true")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Route:       "create_order",
		Mode:        idempotency.ModeSinglePhase,
		ScopeFunc:   func(r *http.Request) (string, error) { return r.Header.Get("X-User-ID"), nil }, // use your authenticated user id
		Fingerprint: idempotency.FingerprintConfig{Fields: []string{"sku_id", "quantity"}},
	})
	if err != nil {
		log.Fatal(err)
	}

	r := gin.New()
	r.POST("/orders", idemgin.Wrap(mw, createOrderHandler))
	_ = r.Run("127.0.0.1:8080")
}

// The chain form protects the handlers registered after it. gin runs its
// chain once, so it serves claim-first routes only: on a single-phase route
// idemgin.Middleware panics. (It only compiles.)
func ExampleMiddleware() {
	db, err := sql.Open("mysql", "app@tcp(db:3306)/shop?interpolateParams=true&parseTime=true")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.New(idempotency.NewMySQLStore(db), &idempotency.Config{
		Route:       "create_order",
		Mode:        idempotency.ModeClaimFirst,                                                      // the default
		ScopeFunc:   func(r *http.Request) (string, error) { return r.Header.Get("X-User-ID"), nil }, // use your authenticated user id
		Fingerprint: idempotency.FingerprintConfig{Fields: []string{"sku_id", "quantity"}},
	})
	if err != nil {
		log.Fatal(err)
	}

	r := gin.New()
	r.POST("/orders", idemgin.Middleware(mw), createOrderHandler)
	_ = r.Run("127.0.0.1:8080")
}

// createOrderHandler writes the order in the request's transaction and
// answers 201; the middleware commits it with the answer.
func createOrderHandler(c *gin.Context) {
	var req struct {
		SKUID    int64 `json:"sku_id"`
		Quantity int   `json:"quantity"`
	}
	if err := c.ShouldBindJSON(&req); err != nil {
		c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()}) // 400 is not stored: a corrected retry executes
		return
	}
	tx, _ := idempotency.TxFromContext(c.Request.Context()) // every write in tx; never commit it
	scope, key, _ := idempotency.KeyFromContext(c.Request.Context())
	order := &idempotency.Order{OrderNo: "O" + rand.Text(), Scope: scope, IdempotencyKey: key, SKUID: req.SKUID, Quantity: req.Quantity}
	if err := idempotency.CreateOrder(c.Request.Context(), tx, order); err != nil {
		c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": "order not created"}) // rolled back, key released
		return
	}
	c.Header("Location", "/orders/"+order.OrderNo)
	c.JSON(http.StatusCreated, gin.H{"order_no": order.OrderNo}) // committed with the snapshot, then sent
}
