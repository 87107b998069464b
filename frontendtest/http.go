package frontendtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/orderguard/idempotency"
)

// HTTP is the client of a front-end that serves the example's HTTP
// contract at baseURL: POST /orders with X-User-ID and Idempotency-Key
// (net/http's Handler, and the gin and echo adapters).
func HTTP(baseURL string) Frontend { return httpFrontend{url: baseURL + "/orders"} }

type httpFrontend struct{ url string }

func (f httpFrontend) Create(ctx context.Context, r Request) Answer {
	body := map[string]any{"user_id": r.User, "sku_id": r.SKU, "quantity": r.Quantity}
	if r.Coupon != nil {
		body["coupon_id"] = *r.Coupon
	}
	if r.Oversize {
		body["note"] = strings.Repeat("x", 2<<20)
	}
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url, bytes.NewReader(raw))
	if err != nil {
		return Answer{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", strconv.FormatInt(r.User, 10))
	if r.Key != "" {
		req.Header.Set("Idempotency-Key", r.Key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Answer{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{Err: err}
	}
	return HTTPAnswer(resp.StatusCode, resp.Header, b)
}

// HTTPAnswer reads an answer of the HTTP contract: its problem's kind,
// the replay mark, Retry-After, the order number. Raw is the status, the
// Content-Type and Location headers and the body.
func HTTPAnswer(status int, h http.Header, body []byte) Answer {
	a := Answer{
		Status:     status,
		Replayed:   h.Get("Idempotent-Replayed") == "true",
		RetryAfter: h.Get("Retry-After") != "",
		Raw:        fmt.Sprintf("%d %s %s\n%s", status, h.Get("Content-Type"), h.Get("Location"), body),
	}
	var fields struct {
		Type    string `json:"type"`
		OrderNo string `json:"order_no"`
	}
	_ = json.Unmarshal(body, &fields)
	a.Kind = strings.TrimPrefix(fields.Type, idempotency.ProblemTypePrefix)
	a.OrderNo = fields.OrderNo
	return a
}
