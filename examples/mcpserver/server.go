package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/orderguard/idempotency/client"
	"github.com/orderguard/idempotency/examples/orderservice"
)

// Version is the MCP implementation version the server announces.
const Version = "v0.1.0"

// Problem kinds this server adds to the order service's and the
// middleware's, for tool errors that never reached the API or got no final
// answer from it.
const (
	// KindMissingKey: the call had no idempotency_key; nothing was sent.
	KindMissingKey = client.ProblemMissingKey
	// KindInvalidKey: the key is not 1–255 visible ASCII characters;
	// nothing was sent.
	KindInvalidKey = client.ProblemInvalidKey
	// KindUnavailable: no final answer within the retry budget (timeouts,
	// connection errors, 503s). The order may or may not exist: call again
	// with the SAME idempotency_key, which is always safe.
	KindUnavailable = "unavailable"
	// KindUnexpected: an answer that is neither an order nor a problem.
	KindUnexpected = "unexpected-response"
)

// Problem is the structured form of a tool error: the problem+json answer's
// kind (for example key-reused, in-progress, coupon-unavailable, not-found,
// invalid-transition) and status, or one of the Kind* values above.
type Problem struct {
	Kind   string `json:"kind"`
	Status int    `json:"status,omitempty"`
	Title  string `json:"title,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// WriteResult is the structured result of create_order and cancel_order.
type WriteResult struct {
	// Order is the order as the API answered it (absent on an error).
	Order *orderservice.OrderResponse `json:"order,omitempty"`
	// Replayed is true when the API replayed the stored answer of an
	// earlier call with the same idempotency_key: the order was NOT created
	// (or canceled) again by this call.
	Replayed bool `json:"replayed"`
	// Attempts is the number of HTTP requests sent, retries included; 0
	// when no final answer came back.
	Attempts int `json:"attempts"`
	// Problem is set on a tool error.
	Problem *Problem `json:"problem,omitempty"`
}

// ReadResult is the structured result of get_order.
type ReadResult struct {
	Order   *orderservice.OrderResponse `json:"order,omitempty"`
	Problem *Problem                    `json:"problem,omitempty"`
}

// CreateOrderInput is the arguments of create_order.
type CreateOrderInput struct {
	UserID         int64  `json:"user_id"`
	SKUID          int64  `json:"sku_id"`
	Quantity       int    `json:"quantity"`
	CouponID       *int64 `json:"coupon_id,omitempty"`
	IdempotencyKey string `json:"idempotency_key"`
	RequestID      string `json:"request_id,omitempty"`
}

// CancelOrderInput is the arguments of cancel_order.
type CancelOrderInput struct {
	UserID         int64  `json:"user_id"`
	OrderNo        string `json:"order_no"`
	IdempotencyKey string `json:"idempotency_key"`
	RequestID      string `json:"request_id,omitempty"`
}

// GetOrderInput is the arguments of get_order.
type GetOrderInput struct {
	UserID  int64  `json:"user_id"`
	OrderNo string `json:"order_no"`
}

// Shared schema fragments. The schemas are written out rather than inferred
// from the Go types so that descriptions, bounds and "required" are exactly
// what docs/create_order.tool.json publishes.
const (
	keySchema = `{
      "type": "string",
      "minLength": 1,
      "maxLength": 255,
      "pattern": "^[!-~]{1,255}$",
      "description": "Idempotency key of this business action. FILLED IN BY THE AGENT RUNTIME, never invented by the model: the runtime derives it with client.KeyFor(runID, toolCallID) (or holds one key per user intent, so a re-planned call for the same intent reuses it) and sends the same value on every retry, re-plan and resumed conversation. A genuinely new order needs a new key. 1-255 visible ASCII characters; passed unchanged as the Idempotency-Key header."
    }`
	requestIDSchema = `{
      "type": "string",
      "maxLength": 128,
      "description": "Optional trace id of this call, forwarded as X-Request-ID. It does not identify the order and may differ between retries: only idempotency_key does."
    }`
	userIDSchema = `{
      "type": "integer",
      "minimum": 1,
      "description": "The ordering user (sent as X-User-ID; the example API's stand-in for authentication). Keys are scoped per user."
    }`
	orderNoSchema = `{
      "type": "string",
      "pattern": "^[A-Za-z0-9_-]{1,64}$",
      "description": "Order number, as returned by create_order."
    }`
	orderSchema = `{
      "type": "object",
      "description": "The order as the API answered it.",
      "properties": {
        "order_no": {"type": "string"},
        "status": {"type": "string", "enum": ["INIT", "CREATED", "PAID", "CANCELED"]},
        "user_id": {"type": "integer"},
        "sku_id": {"type": "integer"},
        "quantity": {"type": "integer"},
        "coupon_id": {"type": ["integer", "null"]},
        "unit_price_cents": {"type": "integer"},
        "discount_cents": {"type": "integer"},
        "total_cents": {"type": "integer"}
      },
      "required": ["order_no", "status", "user_id", "sku_id", "quantity", "unit_price_cents", "discount_cents", "total_cents"]
    }`
	problemSchema = `{
      "type": "object",
      "description": "Set on a tool error. kind is the API's problem kind (key-reused: this key was already used for a DIFFERENT order, do not retry; in-progress: the first call is still running, retry with the same key; coupon-unavailable, unknown-sku, invalid-quantity, not-found, invalid-transition, ...) or, for calls that got no final answer, missing-key, invalid-key, unavailable (outcome unknown: call again with the SAME idempotency_key) or unexpected-response.",
      "properties": {
        "kind": {"type": "string"},
        "status": {"type": "integer"},
        "title": {"type": "string"},
        "detail": {"type": "string"}
      },
      "required": ["kind"]
    }`
	writeResultSchema = `{
    "type": "object",
    "properties": {
      "order": ` + orderSchema + `,
      "replayed": {"type": "boolean", "description": "True when this call replayed the stored answer of an earlier call with the same idempotency_key: nothing was executed again."},
      "attempts": {"type": "integer", "description": "HTTP requests sent, retries included; 0 when no final answer came back (the error text then says how many were tried)."},
      "problem": ` + problemSchema + `
    },
    "required": ["replayed", "attempts"]
  }`
)

// CreateOrderInputSchema is create_order's input schema.
const CreateOrderInputSchema = `{
    "type": "object",
    "properties": {
      "user_id": ` + userIDSchema + `,
      "sku_id": {
        "type": "integer",
        "minimum": 1,
        "description": "Catalog SKU to order (the example catalog has 20001-20100)."
      },
      "quantity": {
        "type": "integer",
        "minimum": 1,
        "maximum": 100,
        "description": "Units to order, 1-100."
      },
      "coupon_id": {
        "type": "integer",
        "minimum": 1,
        "description": "Optional single-use coupon to redeem."
      },
      "idempotency_key": ` + keySchema + `,
      "request_id": ` + requestIDSchema + `
    },
    "required": ["user_id", "sku_id", "quantity", "idempotency_key"],
    "additionalProperties": false
  }`

const createOrderDescription = "Create one order. The call is idempotent per idempotency_key: " +
	"repeating it with the same key and the same order (after a timeout, a retry or a resumed " +
	"conversation) returns the original order with replayed=true instead of ordering twice; " +
	"the same key with different order details is refused with problem kind key-reused. " +
	"The agent runtime fills idempotency_key; do not invent or change it. " +
	"On an 'unavailable' error the order may exist: call again with the same idempotency_key."

// CreateOrderTool returns the create_order tool definition, the one
// published in docs/create_order.tool.json.
func CreateOrderTool() *mcp.Tool {
	return &mcp.Tool{
		Name:         "create_order",
		Title:        "Create order",
		Description:  createOrderDescription,
		InputSchema:  json.RawMessage(CreateOrderInputSchema),
		OutputSchema: json.RawMessage(writeResultSchema),
		Annotations: &mcp.ToolAnnotations{
			// Repeating a call with the same arguments, key included,
			// has no further effect.
			IdempotentHint:  true,
			DestructiveHint: new(false),
			OpenWorldHint:   new(false),
		},
	}
}

func cancelOrderTool() *mcp.Tool {
	return &mcp.Tool{
		Name:  "cancel_order",
		Title: "Cancel order",
		Description: "Cancel a CREATED order. Idempotent per idempotency_key (filled in by the agent runtime, " +
			"like create_order's): repeating the call with the same key replays the first answer. " +
			"Fails with invalid-transition when the order is no longer CREATED.",
		InputSchema: json.RawMessage(`{
    "type": "object",
    "properties": {
      "user_id": ` + userIDSchema + `,
      "order_no": ` + orderNoSchema + `,
      "idempotency_key": ` + keySchema + `,
      "request_id": ` + requestIDSchema + `
    },
    "required": ["user_id", "order_no", "idempotency_key"],
    "additionalProperties": false
  }`),
		OutputSchema: json.RawMessage(writeResultSchema),
		Annotations: &mcp.ToolAnnotations{
			IdempotentHint:  true,
			DestructiveHint: new(true),
			OpenWorldHint:   new(false),
		},
	}
}

func getOrderTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        "get_order",
		Title:       "Get order",
		Description: "Read one of the user's orders by order number.",
		InputSchema: json.RawMessage(`{
    "type": "object",
    "properties": {
      "user_id": ` + userIDSchema + `,
      "order_no": ` + orderNoSchema + `
    },
    "required": ["user_id", "order_no"],
    "additionalProperties": false
  }`),
		OutputSchema: json.RawMessage(`{
    "type": "object",
    "properties": {
      "order": ` + orderSchema + `,
      "problem": ` + problemSchema + `
    }
  }`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: new(false)},
	}
}

// DefaultClient is the client NewServer uses when given none: each attempt
// is bounded by 5 s (the tool gateway's budget for one request), retried
// with the same key for up to 20 s in all.
func DefaultClient() *client.Client {
	return &client.Client{
		HTTP:   &http.Client{Timeout: 5 * time.Second},
		Policy: client.Policy{MaxElapsed: 20 * time.Second},
	}
}

// NewServer returns an MCP server exposing create_order, get_order and
// cancel_order over the order API at baseURL (for example
// http://127.0.0.1:8080). Writes go through hc, the stable-key retrying
// client, with the caller's idempotency_key passed through unchanged; nil
// means DefaultClient().
func NewServer(baseURL string, hc *client.Client) *mcp.Server {
	if hc == nil {
		hc = DefaultClient()
	}
	api := &api{base: strings.TrimRight(baseURL, "/"), c: hc}
	s := mcp.NewServer(&mcp.Implementation{Name: "orderguard-orders", Title: "Orders (idempotent)", Version: Version}, nil)
	mcp.AddTool(s, CreateOrderTool(), api.createOrder)
	mcp.AddTool(s, cancelOrderTool(), api.cancelOrder)
	mcp.AddTool(s, getOrderTool(), api.getOrder)
	return s
}

type api struct {
	base string
	c    *client.Client
}

func (a *api) createOrder(ctx context.Context, _ *mcp.CallToolRequest, in CreateOrderInput) (*mcp.CallToolResult, WriteResult, error) {
	if p := checkKey(in.IdempotencyKey); p != nil {
		return toolError(p, WriteResult{Problem: p})
	}
	body, err := json.Marshal(orderservice.CreateRequest{
		UserID: in.UserID, SKUID: in.SKUID, Quantity: in.Quantity, CouponID: in.CouponID,
	})
	if err != nil {
		return nil, WriteResult{}, err
	}
	return a.write(ctx, a.base+"/orders", in.UserID, in.IdempotencyKey, in.RequestID, body)
}

func (a *api) cancelOrder(ctx context.Context, _ *mcp.CallToolRequest, in CancelOrderInput) (*mcp.CallToolResult, WriteResult, error) {
	if p := checkKey(in.IdempotencyKey); p != nil {
		return toolError(p, WriteResult{Problem: p})
	}
	return a.write(ctx, a.base+"/orders/"+url.PathEscape(in.OrderNo)+"/cancel", in.UserID, in.IdempotencyKey, in.RequestID, nil)
}

// write POSTs body under key through the retrying client and maps the final
// answer to a tool result.
func (a *api) write(ctx context.Context, target string, userID int64, key, requestID string, body []byte) (*mcp.CallToolResult, WriteResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return nil, WriteResult{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("X-User-ID", strconv.FormatInt(userID, 10))
	if requestID != "" {
		req.Header.Set("X-Request-ID", requestID)
	}
	res, err := a.c.Do(ctx, req, key) // the key as given: never generated or changed here
	if err != nil {
		p := &Problem{Kind: KindUnavailable, Title: "No final answer from the order API",
			Detail: err.Error() + "; the outcome is unknown: call again with the same idempotency_key"}
		switch {
		case errors.Is(err, client.ErrNoKey):
			p = &Problem{Kind: KindMissingKey, Title: "idempotency_key is required", Detail: err.Error()}
		case errors.Is(err, client.ErrInvalidKey):
			p = &Problem{Kind: KindInvalidKey, Title: "idempotency_key is invalid", Detail: err.Error()}
		}
		return toolError(p, WriteResult{Problem: p})
	}
	defer res.Response.Body.Close()
	out := WriteResult{Replayed: res.Replayed, Attempts: res.Attempts}
	order, p := decodeOrder(res.Response, res.Problem)
	if p != nil {
		out.Problem = p
		return toolError(p, out)
	}
	out.Order = order
	return nil, out, nil
}

func (a *api) getOrder(ctx context.Context, _ *mcp.CallToolRequest, in GetOrderInput) (*mcp.CallToolResult, ReadResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/orders/"+url.PathEscape(in.OrderNo), nil)
	if err != nil {
		return nil, ReadResult{}, err
	}
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("X-User-ID", strconv.FormatInt(in.UserID, 10))
	hc := a.c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		p := &Problem{Kind: KindUnavailable, Title: "No answer from the order API", Detail: err.Error()}
		return toolError(p, ReadResult{Problem: p})
	}
	defer resp.Body.Close()
	order, p := decodeOrder(resp, nil)
	if p != nil {
		return toolError(p, ReadResult{Problem: p})
	}
	return nil, ReadResult{Order: order}, nil
}

// decodeOrder reads a 2xx order body, or turns anything else into a Problem:
// the problem+json kind when the API sent one.
func decodeOrder(resp *http.Response, prob *client.Problem) (*orderservice.OrderResponse, *Problem) {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, &Problem{Kind: KindUnavailable, Status: resp.StatusCode, Title: "Reading the answer failed", Detail: err.Error()}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		var o orderservice.OrderResponse
		if err := json.Unmarshal(body, &o); err != nil || o.OrderNo == "" {
			return nil, &Problem{Kind: KindUnexpected, Status: resp.StatusCode, Title: "Not an order", Detail: truncate(string(body))}
		}
		return &o, nil
	}
	if prob == nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var cp client.Problem
		if json.Unmarshal(body, &cp) == nil {
			prob = &cp
		}
	}
	if kind := prob.Kind(); kind != "" {
		return nil, &Problem{Kind: kind, Status: resp.StatusCode, Title: prob.Title, Detail: prob.Detail}
	}
	return nil, &Problem{Kind: KindUnexpected, Status: resp.StatusCode, Title: resp.Status, Detail: truncate(string(body))}
}

// checkKey refuses a missing or malformed key before anything is sent; the
// client would refuse it too, but the model should see which it was.
func checkKey(key string) *Problem {
	if key == "" {
		return &Problem{Kind: KindMissingKey, Title: "idempotency_key is required",
			Detail: "The agent runtime must fill idempotency_key (client.KeyFor(runID, toolCallID) or the key held for this intent); nothing was sent."}
	}
	if len(key) > client.MaxKeyLength {
		return &Problem{Kind: KindInvalidKey, Title: "idempotency_key is invalid", Detail: "longer than 255 characters; nothing was sent"}
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return &Problem{Kind: KindInvalidKey, Title: "idempotency_key is invalid", Detail: "only visible ASCII characters are allowed; nothing was sent"}
		}
	}
	return nil
}

// toolError is a tool error (IsError) whose text starts with the problem
// kind, with the structured result alongside.
func toolError[Out any](p *Problem, out Out) (*mcp.CallToolResult, Out, error) {
	text := p.Kind
	if p.Status != 0 {
		text += fmt.Sprintf(" (HTTP %d)", p.Status)
	}
	if p.Title != "" {
		text += ": " + p.Title
	}
	if p.Detail != "" {
		text += ": " + p.Detail
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
}

func truncate(s string) string {
	if len(s) > 512 {
		return s[:512] + "…"
	}
	return s
}
