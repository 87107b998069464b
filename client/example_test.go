package client_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/orderguard/idempotency/client"
)

// orderAPI stands in for the server: its first request finds the store
// unavailable, and a key that already created an order gets that answer
// replayed.
func orderAPI() *httptest.Server {
	var mu sync.Mutex
	calls := 0
	orders := map[string]string{} // key → order id
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"type":"urn:orderguard:problem:store-unavailable","title":"Store unavailable","status":503}`)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		id, done := orders[key]
		if done {
			w.Header().Set("Idempotent-Replayed", "true")
		} else {
			id = fmt.Sprintf("o-%d", len(orders)+1)
			orders[key] = id
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order_id":%q}`, id)
	}))
}

// A tool call that places an order may run more than once (the agent
// re-executes it, the conversation resumes): deriving the key from the
// conversation and tool-call ids makes every run the same business action.
func Example() {
	srv := orderAPI()
	defer srv.Close()

	c := &client.Client{Policy: client.Policy{InitialDelay: 10 * time.Millisecond}}
	key := client.KeyFor("conv-42", "tool-call-7")
	for range 2 {
		res, err := c.PostJSON(context.Background(), srv.URL+"/orders", key, map[string]any{"sku": "A-1", "qty": 1})
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		body, _ := io.ReadAll(res.Response.Body)
		res.Response.Body.Close()
		fmt.Printf("status=%d attempts=%d replayed=%t body=%s\n",
			res.Response.StatusCode, res.Attempts, res.Replayed, body)
	}
	// Output:
	// status=201 attempts=2 replayed=false body={"order_id":"o-1"}
	// status=201 attempts=1 replayed=true body={"order_id":"o-1"}
}

func ExampleKeyFor() {
	fmt.Println(client.KeyFor("run-1", "call-1"))
	// Output: ik1-1a0ccf1047d9a7f09591dd4bb75334644b989152142461a0a54193bd08caedfc
}

// The Transport plugs the retries into any http.Client; the caller sets the
// key, the Transport only reuses it.
func ExampleTransport() {
	srv := orderAPI()
	defer srv.Close()

	hc := &http.Client{Transport: &client.Transport{Policy: client.Policy{InitialDelay: 10 * time.Millisecond}}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A-1"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(client.WithKey(req, client.NewKey()))
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode, client.Replayed(resp))
	// Output: 201 false
}
