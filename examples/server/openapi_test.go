package main

// Contract tests of docs/openapi.yaml: the document is loaded and validated
// with kin-openapi (github.com/getkin/kin-openapi, OpenAPI 3.1 with JSON
// Schema 2020-12), and real answers of the example service, served through
// the server's own mux, are validated against it, request and response. A
// status the document does not list for the operation, a header it requires
// and the answer lacks, or a body its schema refuses fails the test.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/docs"
	"github.com/orderguard/idempotency/examples/orderservice"
	"github.com/orderguard/idempotency/internal/testdb"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/postgres/pgtest"
	"github.com/orderguard/idempotency/sqlite"
)

// openAPIProblemKinds is every problem kind the example server answers: the
// middleware's, the service's, and the service's duplicate-order.
var openAPIProblemKinds = []string{
	idempotency.ProblemMissingKey, idempotency.ProblemInvalidKey, idempotency.ProblemInvalidBody,
	idempotency.ProblemBodyTooLarge, idempotency.ProblemUnsupportedMedia, idempotency.ProblemScopeRequired,
	idempotency.ProblemKeyReused, idempotency.ProblemInProgress, idempotency.ProblemExecutionFailed,
	idempotency.ProblemStoreUnavailable, idempotency.ProblemCommitUnknown,
	orderservice.ProblemInvalidTransition, orderservice.ProblemForbidden, orderservice.ProblemNotFound,
	orderservice.ProblemUnknownSKU, orderservice.ProblemInvalidQuantity, orderservice.ProblemCouponUnavailable,
	"duplicate-order",
}

// openAPIRetryable is docs/http.md's "Which answers to retry" for a problem
// answer: in-progress and every 503, nothing else.
func openAPIRetryable(status int, kind string) bool {
	return kind == idempotency.ProblemInProgress || status == http.StatusServiceUnavailable
}

// Keys whose create fails inside the transaction (Options.AfterCreate), the
// way a database fault there would.
const (
	openAPITransientFaultKey = "openapi-fault-transient"
	openAPIInternalFaultKey  = "openapi-fault-internal"
)

func openAPIInjectFault(ctx context.Context) error {
	switch _, key, _ := idempotency.KeyFromContext(ctx); key {
	case openAPITransientFaultKey:
		return fmt.Errorf("injected deadlock: %w", idempotency.ErrTransient)
	case openAPIInternalFaultKey:
		return errors.New("injected bug")
	}
	return nil
}

// loadOpenAPI loads the embedded document and requires it to be valid.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(docs.OpenAPI)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(loader.Context, openapi3.EnableMultiError()))
	return doc
}

// openAPIBundle is the example service over a fresh database, served through
// the server's mux, with the document routed to it.
type openAPIBundle struct {
	db     *sql.DB
	router routers.Router
	srv    *httptest.Server
}

// setupOpenAPI serves the service on dialect ("sqlite", "mysql" or "postgres") with
// opts, the idempotency middleware on and faults injected by key.
func setupOpenAPI(t *testing.T, dialect string, opts orderservice.Options) *openAPIBundle {
	t.Helper()
	b := &openAPIBundle{}
	switch dialect {
	case "sqlite":
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "orders.db"))
		require.NoError(t, err)
		t.Cleanup(func() { db.Close() })
		b.db, opts.Store = db, sqlite.NewStore(db)
	case "mysql":
		b.db, _ = testdb.MySQL(t)
		opts.Store = idempotency.NewMySQLStore(b.db)
	case "postgres":
		b.db, _ = pgtest.Postgres(t)
		opts.Store = postgres.NewStore(b.db)
	default:
		t.Fatalf("unknown dialect %q", dialect)
	}
	require.NoError(t, orderservice.Setup(context.Background(), b.db, dialect))
	opts.Idempotency = true
	opts.Dialect = dialect
	opts.AfterCreate = openAPIInjectFault
	svc, err := orderservice.New(b.db, opts)
	require.NoError(t, err)
	b.srv = httptest.NewServer(routes(http.NotFoundHandler(), svc))
	t.Cleanup(b.srv.Close)

	doc := loadOpenAPI(t)
	doc.Servers = openapi3.Servers{{URL: b.srv.URL}} // route the test server's requests
	b.router, err = gorillamux.NewRouter(doc)
	require.NoError(t, err)
	return b
}

// openAPICall is one request; empty header fields are not sent.
type openAPICall struct {
	method, path string
	user, key    string // X-User-ID, Idempotency-Key
	contentType  string
	body         string
}

func openAPICreate(user, key, body string) openAPICall {
	return openAPICall{method: http.MethodPost, path: "/orders", user: user, key: key,
		contentType: "application/json", body: body}
}

// openAPIExchange is a request, its answer read in full, and what the
// document says about both.
type openAPIExchange struct {
	status      int
	header      http.Header
	body        []byte
	requestErr  error                 // the document refuses the request
	responseErr error                 // the document refuses the answer
	response    *openapi3.ResponseRef // the documented response for the status
}

func (x openAPIExchange) String() string {
	return fmt.Sprintf("%d %s\nrequest: %v\nresponse: %v", x.status, x.body, x.requestErr, x.responseErr)
}

func (x openAPIExchange) order(t *testing.T) orderservice.OrderResponse {
	t.Helper()
	var o orderservice.OrderResponse
	require.NoError(t, json.Unmarshal(x.body, &o), "body: %s", x.body)
	return o
}

// exchange validates c against the document, sends it, and validates the
// answer against the document. It never fails the test (it may run on
// another goroutine); the caller checks the result.
func (b *openAPIBundle) exchange(ctx context.Context, c openAPICall) (openAPIExchange, error) {
	newRequest := func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, c.method, b.srv.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			return nil, err
		}
		for name, v := range map[string]string{"X-User-ID": c.user, "Idempotency-Key": c.key, "Content-Type": c.contentType} {
			if v != "" {
				req.Header.Set(name, v)
			}
		}
		return req, nil
	}
	var x openAPIExchange
	req, err := newRequest()
	if err != nil {
		return x, err
	}
	route, params, err := b.router.FindRoute(req)
	if err != nil {
		return x, fmt.Errorf("the document has no operation for %s %s: %w", c.method, c.path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{MultiError: true, AuthenticationFunc: openAPIAuthenticate}}
	x.requestErr = openapi3filter.ValidateRequest(ctx, in)

	send, err := newRequest()
	if err != nil {
		return x, err
	}
	resp, err := http.DefaultClient.Do(send)
	if err != nil {
		return x, err
	}
	defer resp.Body.Close()
	if x.body, err = io.ReadAll(resp.Body); err != nil {
		return x, err
	}
	x.status, x.header = resp.StatusCode, resp.Header
	x.response = route.Operation.Responses.Status(resp.StatusCode)
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: x.status, Header: x.header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
	out.SetBodyBytes(x.body)
	x.responseErr = openapi3filter.ValidateResponse(ctx, out)
	return x, nil
}

// openAPIWant is what an exchange must show beside agreeing with the
// document.
type openAPIWant struct {
	refused  string // when set, the document refuses the request for this reason
	status   int    //
	kind     string // the problem kind; "" for a success
	replayed bool   // Idempotent-Replayed: true
	body     []byte // when set, the answer's exact body
}

// check requires x to match the document and want.
func (b *openAPIBundle) check(t *testing.T, x openAPIExchange, want openAPIWant) {
	t.Helper()
	require.NoError(t, x.responseErr, "the document must describe the answer: %s", x.body)
	if want.refused == "" {
		require.NoError(t, x.requestErr, "the document must admit the request")
	} else {
		require.ErrorContains(t, x.requestErr, want.refused, "the document must refuse the request the server refuses")
	}
	require.Equal(t, want.status, x.status, "body: %s", x.body)
	if want.replayed {
		require.Equal(t, "true", x.header.Get("Idempotent-Replayed"))
	} else {
		require.Empty(t, x.header.Values("Idempotent-Replayed"))
	}
	if want.body != nil {
		require.Equal(t, string(want.body), string(x.body))
	}
	if want.kind == "" {
		require.Less(t, x.status, 400, "body: %s", x.body)
		return
	}
	require.Equal(t, "application/problem+json", x.header.Get("Content-Type"))
	var p idempotency.Problem
	require.NoError(t, json.Unmarshal(x.body, &p))
	require.Equal(t, want.kind, p.Kind(), "body: %s", x.body)
	retryable := openAPIRetryable(x.status, want.kind)
	byType, ok := x.response.Value.Extensions["x-retryable-by-type"].(map[string]any)
	require.True(t, ok, "the %d response has no x-retryable-by-type", x.status)
	require.Equal(t, retryable, byType[p.Type], "x-retryable-by-type[%s] of the %d response", p.Type, x.status)
	if retryable {
		require.Equal(t, "1", x.header.Get("Retry-After"))
	} else {
		require.Empty(t, x.header.Get("Retry-After"))
	}
}

// step runs one exchange as a subtest and returns it; the test stops when
// a step fails, as later steps build on earlier ones.
func (b *openAPIBundle) step(t *testing.T, name string, c openAPICall, want openAPIWant) openAPIExchange {
	t.Helper()
	var x openAPIExchange
	if !t.Run(name, func(t *testing.T) {
		var err error
		x, err = b.exchange(t.Context(), c)
		require.NoError(t, err)
		b.check(t, x, want)
	}) {
		t.FailNow()
	}
	return x
}

// openAPIAuthenticate checks a request against the document's security
// scheme as the server does: an apiKey header must be there (the server
// then requires a positive integer, which the X-User-ID parameter states).
func openAPIAuthenticate(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	s := in.SecurityScheme
	if s.Type != "apiKey" || s.In != "header" {
		return fmt.Errorf("security scheme %s: the example server knows only an apiKey header", in.SecuritySchemeName)
	}
	if in.RequestValidationInput.Request.Header.Get(s.Name) == "" {
		return fmt.Errorf("security scheme %s: no %s header", in.SecuritySchemeName, s.Name)
	}
	return nil
}

// The document declares the security the server has: X-User-ID, an apiKey
// header, on every order operation, and none on /healthz (which the server
// answers without it) or the payment webhooks (signed by their providers). Linters (Redocly's recommended security-defined
// rule, scripts/lint-openapi.sh) refuse an operation that declares none.
func TestOpenAPI_Security_XUserIDOnEveryOrderOperationNoneOnHealthz(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	scheme := doc.Components.SecuritySchemes["UserID"]
	require.NotNil(t, scheme, "components.securitySchemes.UserID")
	require.Equal(t, "apiKey", scheme.Value.Type)
	require.Equal(t, "header", scheme.Value.In)
	require.Equal(t, "X-User-ID", scheme.Value.Name)
	require.Equal(t, openapi3.SecurityRequirements{{"UserID": {}}}, doc.Security, "the root requires X-User-ID")
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if path == "/healthz" || strings.HasPrefix(path, "/webhooks/") {
				// Liveness needs no user; a provider's callback carries
				// its signature, not a user.
				require.NotNil(t, op.Security, "%s %s opts out of the root's security", method, path)
				require.Empty(t, *op.Security, "%s %s needs no X-User-ID", method, path)
				continue
			}
			require.Nil(t, op.Security, "%s %s inherits the root's X-User-ID", method, path)
			user := op.Parameters.GetByInAndName("header", "X-User-ID")
			require.NotNil(t, user, "%s %s states X-User-ID's form", method, path)
			require.True(t, user.Required)
		}
	}
}

func TestOpenAPI_Document_IsValidOpenAPI31AndDescribesEveryRoute(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	require.True(t, doc.IsOpenAPI31OrLater(), "openapi: %s", doc.OpenAPI)
	var got []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			got = append(got, method+" "+path)
		}
	}
	require.ElementsMatch(t, []string{
		"POST /orders", "GET /orders/{order_no}", "POST /orders/{order_no}/cancel",
		"POST /orders/{order_no}/pay", "GET /healthz",
		"POST /webhooks/stripe", "POST /webhooks/standard", "POST /webhooks/alipay", "POST /webhooks/wechatpay",
	}, got)
	for _, write := range []string{"/orders", "/orders/{order_no}/cancel", "/orders/{order_no}/pay"} {
		key := doc.Paths.Find(write).Post.Parameters.GetByInAndName("header", "Idempotency-Key")
		require.NotNil(t, key, "POST %s", write)
		require.True(t, key.Required, "POST %s: Idempotency-Key is required", write)
		require.Contains(t, key.Description, "must stay the same for every retry")
	}
}

// openAPIResponseKinds returns the problem kinds a response's schema admits:
// the const type of the schema or of each of its oneOf branches.
func openAPIResponseKinds(t *testing.T, schema *openapi3.SchemaRef) map[string]int {
	t.Helper()
	branches := schema.Value.OneOf
	if len(branches) == 0 {
		branches = openapi3.SchemaRefs{schema}
	}
	kinds := map[string]int{}
	for _, branch := range branches {
		typ, status := branch.Value.Properties["type"], branch.Value.Properties["status"]
		require.NotNil(t, typ, "a problem schema without a const type")
		require.NotNil(t, status, "a problem schema without a const status")
		kind, ok := typ.Value.Const.(string)
		require.True(t, ok, "type const %v", typ.Value.Const)
		code, ok := status.Value.Const.(float64)
		require.True(t, ok, "status const %v", status.Value.Const)
		kinds[kind] = int(code)
	}
	return kinds
}

func TestOpenAPI_EveryResponse_SaysWhetherToRetryWithTheSameKey(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code, ref := range op.Responses.Map() {
				t.Run(method+" "+path+" "+code, func(t *testing.T) {
					resp := ref.Value
					require.Contains(t, resp.Extensions, "x-retryable")
					retryable, ok := resp.Extensions["x-retryable"].(bool)
					require.True(t, ok, "x-retryable must be a boolean")
					if strings.HasPrefix(path, "/webhooks/") {
						// A provider's callback: its provider retries every
						// answer but its success; the document says which
						// it should, a 503's retry after Retry-After.
						require.Equal(t, code == "503", retryable, "x-retryable: only a 503 is worth delivering again")
						if retryable {
							require.Contains(t, resp.Headers, "Retry-After")
						}
						require.NotContains(t, resp.Extensions, "x-retryable-by-type", "a provider reads no problem types")
						return
					}
					media := resp.Content.Get("application/problem+json")
					if media == nil {
						require.False(t, retryable, "a success is never retried")
						require.NotContains(t, resp.Extensions, "x-retryable-by-type")
						return
					}
					require.Regexp(t, `(?i)retry`, *resp.Description, "the description says whether to retry")
					var status int
					_, err := fmt.Sscan(code, &status)
					require.NoError(t, err)
					byType, ok := resp.Extensions["x-retryable-by-type"].(map[string]any)
					require.True(t, ok, "a problem response needs x-retryable-by-type")
					kinds := openAPIResponseKinds(t, media.Schema)
					all := true
					for typ, code := range kinds {
						kind := strings.TrimPrefix(typ, idempotency.ProblemTypePrefix)
						require.Contains(t, openAPIProblemKinds, kind, "an invented problem kind")
						require.Equal(t, status, code, "%s under %d", typ, status)
						require.Equal(t, openAPIRetryable(status, kind), byType[typ], "x-retryable-by-type[%s]", typ)
						all = all && openAPIRetryable(status, kind)
						documented[kind] = true
					}
					require.Len(t, byType, len(kinds), "x-retryable-by-type lists exactly the schema's types")
					require.Equal(t, all, retryable, "x-retryable: every answer with this status may be retried")
					if all {
						require.True(t, resp.Headers["Retry-After"].Value.Required, "a retryable answer carries Retry-After")
					}
					if _, ok := byType[idempotency.ProblemTypePrefix+idempotency.ProblemInProgress]; ok {
						require.Contains(t, resp.Headers, "Retry-After", "in-progress carries Retry-After")
					}
				})
			}
		}
	}
	for _, kind := range openAPIProblemKinds {
		require.True(t, documented[kind], "problem kind %s is not documented", kind)
	}
}

func TestOpenAPI_IdempotencyKeyPattern_AcceptsExactlyWhatParseKeyAccepts(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	pattern := regexp.MustCompile(doc.Components.Parameters["IdempotencyKey"].Value.Schema.Value.Pattern)
	const maxLen = 255
	agree := func(t *testing.T, key string) {
		t.Helper()
		_, err := idempotency.ParseKey(key, maxLen)
		require.Equal(t, err == nil, pattern.MatchString(key), "key %q: ParseKey error %v", key, err)
	}
	for _, key := range []string{
		"a", "run-7f3a91c4/call-1", "ik1-" + strings.Repeat("0f", 32), strings.Repeat("a", 255), `a"b`, `a\b`,
		`"abc"`, `"a\"b"`, `"a\\b"`, `"` + strings.Repeat("a", 255) + `"`, `"` + strings.Repeat("a", 254) + `\\"`,
		"", strings.Repeat("a", 256), "a b", "é", "a\x7f", `""`, `"abc`, `"a b"`, `"a\nb"`, `"a"b"`, `"a\"`,
		`"` + strings.Repeat("a", 256) + `"`, `"` + strings.Repeat("a", 255) + `\\"`,
	} {
		agree(t, key)
	}
	// Random keys from an alphabet of the edge bytes; header values never
	// carry surrounding whitespace (net/http trims it, as ParseKey does).
	alphabet := []byte{'a', '~', '!', '"', '\\', ' ', 0x7f, 0x20 - 1, 'n'}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if key := string(b); key == strings.Trim(key, " \t") {
			agree(t, key)
		}
	}
}

func TestOpenAPI_Server_ServesTheEmbeddedDocument(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(routes(http.NotFoundHandler(), http.NotFoundHandler()))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/openapi.yaml")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/yaml", resp.Header.Get("Content-Type"))
	require.Equal(t, string(docs.OpenAPI), string(body))
	require.NotEmpty(t, docs.OpenAPI)
}

func TestOpenAPI_ServerAnswers_MatchTheDocument(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "mysql", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			b := setupOpenAPI(t, dialect, orderservice.Options{})
			const user = "1001"
			order := `{"user_id":1001,"sku_id":20087,"quantity":1,"coupon_id":99}`

			created := b.step(t, "create_answers_201_with_Location", openAPICreate(user, "openapi-create", order),
				openAPIWant{status: http.StatusCreated})
			orderNo := created.order(t).OrderNo
			require.Equal(t, "/orders/"+orderNo, created.header.Get("Location"))
			b.step(t, "retry_with_reordered_fields_replays_201_byte_for_byte",
				openAPICreate(user, "openapi-create", `{"sku_id":20087,"user_id":1001,"quantity":1,"coupon_id":99,"trace_id":"retry-2"}`),
				openAPIWant{status: http.StatusCreated, replayed: true, body: created.body})
			b.step(t, "same_key_other_coupon_is_409_key_reused",
				openAPICreate(user, "openapi-create", `{"user_id":1001,"sku_id":20087,"quantity":1,"coupon_id":100}`),
				openAPIWant{status: http.StatusConflict, kind: idempotency.ProblemKeyReused})

			unknown := b.step(t, "unknown_sku_is_422",
				openAPICreate(user, "openapi-unknown-sku", `{"user_id":1001,"sku_id":99999,"quantity":1}`),
				openAPIWant{status: http.StatusUnprocessableEntity, kind: orderservice.ProblemUnknownSKU})
			b.step(t, "unknown_sku_retry_replays_422",
				openAPICreate(user, "openapi-unknown-sku", `{"user_id":1001,"sku_id":99999,"quantity":1}`),
				openAPIWant{status: http.StatusUnprocessableEntity, kind: orderservice.ProblemUnknownSKU,
					replayed: true, body: unknown.body})
			b.step(t, "quantity_over_100_is_422_and_outside_the_schema",
				openAPICreate(user, "openapi-quantity", `{"user_id":1001,"sku_id":20001,"quantity":101}`),
				openAPIWant{refused: `"/quantity": at '/quantity': maximum`, status: http.StatusUnprocessableEntity, kind: orderservice.ProblemInvalidQuantity})
			b.step(t, "used_coupon_is_422",
				openAPICreate(user, "openapi-coupon", `{"user_id":1001,"sku_id":20001,"quantity":1,"coupon_id":99}`),
				openAPIWant{status: http.StatusUnprocessableEntity, kind: orderservice.ProblemCouponUnavailable})
			b.step(t, "proposed_order_no_is_201",
				openAPICreate(user, "openapi-order-no-1", `{"user_id":1001,"sku_id":20001,"quantity":1,"order_no":"OA-1"}`),
				openAPIWant{status: http.StatusCreated})
			b.step(t, "existing_order_no_under_a_new_key_is_409_duplicate_order",
				openAPICreate(user, "openapi-order-no-2", `{"user_id":1001,"sku_id":20001,"quantity":1,"order_no":"OA-1"}`),
				openAPIWant{status: http.StatusConflict, kind: "duplicate-order"})

			b.step(t, "no_key_is_400_missing_key", openAPICreate(user, "", order),
				openAPIWant{refused: `"Idempotency-Key" in header has an error: value is required`, status: http.StatusBadRequest, kind: idempotency.ProblemMissingKey})
			b.step(t, "key_with_a_space_is_400_invalid_key", openAPICreate(user, `"a b"`, order),
				openAPIWant{refused: `"Idempotency-Key" in header has an error: validation failed`, status: http.StatusBadRequest, kind: idempotency.ProblemInvalidKey})
			b.step(t, "truncated_json_is_400_invalid_body", openAPICreate(user, "openapi-bad-body", `{"user_id":1001,`),
				openAPIWant{refused: "failed to decode request body", status: http.StatusBadRequest, kind: idempotency.ProblemInvalidBody})
			b.step(t, "body_over_64KiB_is_413",
				openAPICreate(user, "openapi-large", `{"user_id":1001,"sku_id":20001,"quantity":1,"trace_id":"`+strings.Repeat("x", 70<<10)+`"}`),
				openAPIWant{status: http.StatusRequestEntityTooLarge, kind: idempotency.ProblemBodyTooLarge})
			plain := openAPICreate(user, "openapi-plain", order)
			plain.contentType = "text/plain"
			b.step(t, "json_sent_as_text_plain_is_415", plain,
				openAPIWant{refused: `Content-Type has unexpected value "text/plain"`, status: http.StatusUnsupportedMediaType, kind: idempotency.ProblemUnsupportedMedia})
			b.step(t, "no_user_is_401", openAPICreate("", "openapi-anonymous", order),
				openAPIWant{refused: `"X-User-ID" in header has an error: value is required`, status: http.StatusUnauthorized, kind: idempotency.ProblemScopeRequired})
			b.step(t, "another_users_body_is_403",
				openAPICreate(user, "openapi-forbidden", `{"user_id":1002,"sku_id":20001,"quantity":1}`),
				openAPIWant{status: http.StatusForbidden, kind: orderservice.ProblemForbidden})
			b.step(t, "transient_fault_is_503_with_Retry_After",
				openAPICreate(user, openAPITransientFaultKey, `{"user_id":1001,"sku_id":20001,"quantity":2}`),
				openAPIWant{status: http.StatusServiceUnavailable, kind: idempotency.ProblemStoreUnavailable})
			b.step(t, "handler_bug_is_500",
				openAPICreate(user, openAPIInternalFaultKey, `{"user_id":1001,"sku_id":20001,"quantity":3}`),
				openAPIWant{status: http.StatusInternalServerError, kind: idempotency.ProblemExecutionFailed})

			get := openAPICall{method: http.MethodGet, path: "/orders/" + orderNo, user: user}
			b.step(t, "owner_reads_200", get, openAPIWant{status: http.StatusOK})
			get.user = "1002"
			b.step(t, "another_user_reads_404", get,
				openAPIWant{status: http.StatusNotFound, kind: orderservice.ProblemNotFound})

			cancel := openAPICall{method: http.MethodPost, path: "/orders/" + orderNo + "/cancel", user: user, key: "openapi-cancel"}
			canceled := b.step(t, "cancel_is_200", cancel, openAPIWant{status: http.StatusOK})
			require.Equal(t, "CANCELED", canceled.order(t).Status)
			b.step(t, "cancel_retry_replays_200", cancel,
				openAPIWant{status: http.StatusOK, replayed: true, body: canceled.body})
			other := cancel
			other.path = "/orders/OA-1/cancel"
			b.step(t, "cancel_key_on_another_order_is_409_key_reused", other,
				openAPIWant{status: http.StatusConflict, kind: idempotency.ProblemKeyReused})
			pay := openAPICall{method: http.MethodPost, path: "/orders/" + orderNo + "/pay", user: user, key: "openapi-pay"}
			refused := b.step(t, "paying_a_canceled_order_is_409_invalid_transition", pay,
				openAPIWant{status: http.StatusConflict, kind: orderservice.ProblemInvalidTransition})
			b.step(t, "invalid_transition_retry_replays_409", pay,
				openAPIWant{status: http.StatusConflict, kind: orderservice.ProblemInvalidTransition,
					replayed: true, body: refused.body})
			b.step(t, "paying_an_unknown_order_is_404",
				openAPICall{method: http.MethodPost, path: "/orders/O-none/pay", user: user, key: "openapi-pay-none"},
				openAPIWant{status: http.StatusNotFound, kind: orderservice.ProblemNotFound})

			b.step(t, "healthz_is_200", openAPICall{method: http.MethodGet, path: "/healthz"},
				openAPIWant{status: http.StatusOK})
		})
	}
}

// TestOpenAPI_InProgressAnswer_MatchesTheDocument needs MariaDB: on SQLite
// the duplicate's claim waits for the single writer and then replays.
func TestOpenAPI_InProgressAnswer_MatchesTheDocument(t *testing.T) {
	t.Parallel()
	b := setupOpenAPI(t, "mysql", orderservice.Options{HandlerDelay: 2 * time.Second})
	create := openAPICreate("1001", "openapi-slow", `{"user_id":1001,"sku_id":20001,"quantity":1}`)

	type result struct {
		x   openAPIExchange
		err error
	}
	first := make(chan result, 1)
	go func() {
		x, err := b.exchange(context.Background(), create)
		first <- result{x, err}
	}()
	require.Eventually(t, func() bool {
		var status string
		err := b.db.QueryRow(`SELECT status FROM idempotency_record WHERE idempotency_key = ?`, create.key).Scan(&status)
		return err == nil && status == string(idempotency.StatusProcessing)
	}, 5*time.Second, 10*time.Millisecond, "the first request claims the key")

	x, err := b.exchange(t.Context(), create)
	require.NoError(t, err)
	b.check(t, x, openAPIWant{status: http.StatusConflict, kind: idempotency.ProblemInProgress})

	r := <-first
	require.NoError(t, r.err)
	b.check(t, r.x, openAPIWant{status: http.StatusCreated})
	x, err = b.exchange(t.Context(), create)
	require.NoError(t, err)
	b.check(t, x, openAPIWant{status: http.StatusCreated, replayed: true, body: r.x.body})
}

// TestOpenAPI_Validator_RefusesAnswersTheDocumentDoesNotDescribe keeps the
// checks above honest: the same validation refuses an undocumented status,
// a missing required header and a body outside the schema.
func TestOpenAPI_Validator_RefusesAnswersTheDocumentDoesNotDescribe(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	doc.Servers = openapi3.Servers{{URL: "http://127.0.0.1:8080"}}
	router, err := gorillamux.NewRouter(doc)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8080/orders", strings.NewReader(`{}`))
	route, params, err := router.FindRoute(req)
	require.NoError(t, err)

	order := `{"order_no":"O1","status":"CREATED","user_id":1,"sku_id":20001,"quantity":1,"coupon_id":null,"unit_price_cents":1000,"discount_cents":0,"total_cents":1000}`
	problem := func(kind string, status int) string {
		return fmt.Sprintf(`{"type":"%s%s","title":"t","status":%d}`, idempotency.ProblemTypePrefix, kind, status)
	}
	validate := func(status int, header http.Header, body string) error {
		in := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
			Status:                 status,
			Header:                 header,
			Options:                &openapi3filter.Options{IncludeResponseStatus: true},
		}
		in.SetBodyBytes([]byte(body))
		return openapi3filter.ValidateResponse(context.Background(), in)
	}
	jsonHeader := func(kv ...string) http.Header {
		h := http.Header{"Content-Type": {"application/json"}}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	problemHeader := http.Header{"Content-Type": {"application/problem+json"}}

	// The controls pass; each case below breaks one of them.
	require.NoError(t, validate(http.StatusCreated, jsonHeader("Location", "/orders/O1"), order))
	require.NoError(t, validate(http.StatusConflict, problemHeader, problem(idempotency.ProblemKeyReused, 409)))
	require.NoError(t, validate(http.StatusServiceUnavailable,
		http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"1"}}, problem(idempotency.ProblemStoreUnavailable, 503)))
	for name, err := range map[string]error{
		"undocumented status":              validate(http.StatusTeapot, jsonHeader(), order),
		"201 without Location":             validate(http.StatusCreated, jsonHeader(), order),
		"201 without total_cents":          validate(http.StatusCreated, jsonHeader("Location", "/orders/O1"), strings.Replace(order, `,"total_cents":1000`, "", 1)),
		"201 with status INIT":             validate(http.StatusCreated, jsonHeader("Location", "/orders/O1"), strings.Replace(order, "CREATED", "INIT", 1)),
		"Idempotent-Replayed: false":       validate(http.StatusCreated, jsonHeader("Location", "/orders/O1", "Idempotent-Replayed", "false"), order),
		"409 with a 422 kind":              validate(http.StatusConflict, problemHeader, problem(orderservice.ProblemUnknownSKU, 409)),
		"409 invalid-transition on create": validate(http.StatusConflict, problemHeader, problem(orderservice.ProblemInvalidTransition, 409)),
		"503 without Retry-After":          validate(http.StatusServiceUnavailable, problemHeader, problem(idempotency.ProblemStoreUnavailable, 503)),
		"problem as application/json":      validate(http.StatusUnprocessableEntity, jsonHeader(), problem(orderservice.ProblemUnknownSKU, 422)),
	} {
		require.Error(t, err, name)
	}
}
