package tracing_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/internal/obstest"
	"github.com/orderguard/idempotency/tracing"
)

// Distinctive secrets: none of them may appear in any span.
const (
	secretScope = "tenant-scope-9f2c31"
	secretKey   = "order-key-7d41e0aa"
	secretNote  = "body-marker-55ab77" // inside every request body
)

// newTracing returns an Observer over an SDK tracer provider that records
// every ended span, and a tracer of the same provider for the test's own
// spans.
func newTracing(t *testing.T) (*tracing.Observer, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing.New(tp), sr, tp.Tracer("test")
}

// traces groups the ended spans by trace, each keyed by span name. It fails
// if a trace has two spans of one name.
func traces(t *testing.T, sr *tracetest.SpanRecorder) []map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	byTrace := map[trace.TraceID]map[string]sdktrace.ReadOnlySpan{}
	var order []trace.TraceID
	for _, s := range sr.Ended() {
		id := s.SpanContext().TraceID()
		if byTrace[id] == nil {
			byTrace[id] = map[string]sdktrace.ReadOnlySpan{}
			order = append(order, id)
		}
		require.NotContains(t, byTrace[id], s.Name(), "two %s spans in one trace", s.Name())
		byTrace[id][s.Name()] = s
	}
	out := make([]map[string]sdktrace.ReadOnlySpan, 0, len(order))
	for _, id := range order {
		out = append(out, byTrace[id])
	}
	return out
}

// names returns the span names of one trace.
func names(tr map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for n := range tr {
		out = append(out, n)
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

func requireChildOf(t *testing.T, parent, child sdktrace.ReadOnlySpan) {
	t.Helper()
	require.Equal(t, parent.SpanContext().SpanID(), child.Parent().SpanID(),
		"%s is not a child of %s", child.Name(), parent.Name())
	require.Equal(t, parent.SpanContext().TraceID(), child.SpanContext().TraceID())
}

// requireNoSecrets fails if a span name, attribute, event (name or
// attribute), link or status description contains the raw key, the scope or
// the body.
func requireNoSecrets(t *testing.T, spans []sdktrace.ReadOnlySpan, body string) {
	t.Helper()
	check := func(where, s string) {
		for _, secret := range []string{secretKey, secretScope, secretNote, body} {
			if secret == "" {
				continue
			}
			require.NotContains(t, s, secret, "%s leaks a secret", where)
		}
	}
	for _, s := range spans {
		check("span name", s.Name())
		check(s.Name()+" status", s.Status().Description)
		for _, kv := range s.Attributes() {
			check(s.Name()+" attribute "+string(kv.Key), kv.Value.Emit())
		}
		for _, e := range s.Events() {
			check(s.Name()+" event", e.Name)
			for _, kv := range e.Attributes {
				check(s.Name()+" event "+e.Name+" attribute "+string(kv.Key), kv.Value.Emit())
			}
		}
	}
}

func TestObserver_CreateThenReplay_StageSpansAreChildrenOfTheRequestSpan_WithOutcomeAndKeyHash(t *testing.T) {
	t.Parallel()
	obs, sr, tracer := newTracing(t)
	s := newService(t, obs, tracer)
	body := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 2, Note: secretNote})

	for range 2 {
		status, _ := s.Do(t, obstest.Call{Tenant: secretScope, Key: secretKey, Body: body})
		require.Equal(t, http.StatusCreated, status)
	}
	s.WaitServed(t, 2)

	trs := traces(t, sr)
	require.Len(t, trs, 2)
	keyHash := idempotency.KeyHash(secretScope, secretKey)

	// The create: claim, execute (with the handler's span inside) and
	// finalize under the request span, which is under the server span.
	create := trs[0]
	require.ElementsMatch(t, []string{spanServer, tracing.SpanRequest, tracing.SpanClaim, tracing.SpanExecute,
		spanInsert, tracing.SpanFinalize}, names(create))
	req := create[tracing.SpanRequest]
	requireChildOf(t, create[spanServer], req)
	for _, stage := range []string{tracing.SpanClaim, tracing.SpanExecute, tracing.SpanFinalize} {
		requireChildOf(t, req, create[stage])
		require.Equal(t, obstest.RouteOrders, attrs(create[stage])[tracing.AttrRoute].AsString(), stage)
	}
	requireChildOf(t, create[tracing.SpanExecute], create[spanInsert])

	a := attrs(req)
	require.Equal(t, obstest.RouteOrders, a[tracing.AttrRoute].AsString())
	require.Equal(t, "committed", a[tracing.AttrOutcome].AsString())
	require.Equal(t, keyHash, a[tracing.AttrKeyHash].AsString())
	require.Equal(t, int64(http.StatusCreated), a[tracing.AttrStatusCode].AsInt64())
	require.Equal(t, codes.Unset, req.Status().Code)
	require.Equal(t, trace.SpanKindInternal, req.SpanKind())
	require.Equal(t, []string{"idempotency.claimed"}, eventNames(req), "the claim step is an event on the request span")

	claim := attrs(create[tracing.SpanClaim])
	require.Equal(t, "claimed", claim[tracing.AttrOutcome].AsString())
	require.Equal(t, "PROCESSING", claim[tracing.AttrRecordStatus].AsString())

	// The retry: a claim that finds the DONE record, then its replay.
	replay := trs[1]
	require.ElementsMatch(t, []string{spanServer, tracing.SpanRequest, tracing.SpanClaim, tracing.SpanReplay}, names(replay))
	req = replay[tracing.SpanRequest]
	requireChildOf(t, replay[spanServer], req)
	requireChildOf(t, req, replay[tracing.SpanClaim])
	requireChildOf(t, req, replay[tracing.SpanReplay])
	a = attrs(req)
	require.Equal(t, "replayed", a[tracing.AttrOutcome].AsString())
	require.Equal(t, "DONE", a[tracing.AttrRecordStatus].AsString())
	require.Equal(t, keyHash, a[tracing.AttrKeyHash].AsString())
	require.Equal(t, "DONE", attrs(replay[tracing.SpanClaim])[tracing.AttrRecordStatus].AsString())
	require.Equal(t, "replayed", attrs(replay[tracing.SpanReplay])[tracing.AttrOutcome].AsString())
	require.Empty(t, req.Events(), "a replay claims nothing")

	requireNoSecrets(t, sr.Ended(), body)
}

func TestObserver_ConflictInProgressAndRelease_RecordTheirOutcomes_WithoutErrorStatus(t *testing.T) {
	t.Parallel()
	obs, sr, tracer := newTracing(t)
	s := newService(t, obs, tracer)
	body := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 1, Note: secretNote, Block: true})
	other := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 9, Note: secretNote})

	first := make(chan int, 1)
	go func() {
		st, _ := s.Do(t, obstest.Call{Tenant: secretScope, Key: secretKey, Body: body})
		first <- st
	}()
	<-s.Entered
	status, _ := s.Do(t, obstest.Call{Tenant: secretScope, Key: secretKey, Body: body})
	require.Equal(t, http.StatusConflict, status)
	status, _ = s.Do(t, obstest.Call{Tenant: secretScope, Key: secretKey, Body: other})
	require.Equal(t, http.StatusConflict, status)
	s.Release()
	require.Equal(t, http.StatusCreated, <-first)
	// Keys are unique per scope, not per route: the flaky route needs its own.
	status, _ = s.Do(t, obstest.Call{Path: "/flaky", Tenant: secretScope, Key: secretKey + "-flaky", Body: body})
	require.Equal(t, http.StatusServiceUnavailable, status)
	s.WaitServed(t, 4)

	byOutcome := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		if s.Name() == tracing.SpanRequest {
			byOutcome[attrs(s)[tracing.AttrOutcome].AsString()] = s
		}
	}
	require.Len(t, byOutcome, 4)
	for outcome, want := range map[string]int64{"in_progress": 409, "conflict": 409, "committed": 201, "released": 503} {
		span := byOutcome[outcome]
		require.NotNil(t, span, outcome)
		require.Equal(t, want, attrs(span)[tracing.AttrStatusCode].AsInt64(), outcome)
		require.Equal(t, codes.Unset, span.Status().Code, "%s is an answer, not an error of the middleware", outcome)
	}
	require.Equal(t, obstest.RouteFlaky, attrs(byOutcome["released"])[tracing.AttrRoute].AsString())
	requireNoSecrets(t, sr.Ended(), body)
	requireNoSecrets(t, sr.Ended(), other)
}

func TestObserver_TakeOverOfAnExpiredLease_IsAnEventOnTheRequestSpan(t *testing.T) {
	t.Parallel()
	obs, sr, tracer := newTracing(t)
	s := newService(t, obs, tracer)
	body := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 1, Note: secretNote})
	s.Abandon(t, secretScope, secretKey, obstest.Fingerprint(t, body))

	status, _ := s.Do(t, obstest.Call{Tenant: secretScope, Key: secretKey, Body: body})
	require.Equal(t, http.StatusCreated, status)
	s.WaitServed(t, 1)

	tr := traces(t, sr)[0]
	req := tr[tracing.SpanRequest]
	require.Equal(t, []string{"idempotency.taken_over"}, eventNames(req))
	require.Equal(t, "taken_over", req.Events()[0].Attributes[0].Value.AsString())
	require.Equal(t, "committed", attrs(req)[tracing.AttrOutcome].AsString())
	require.Equal(t, "taken_over", attrs(tr[tracing.SpanClaim])[tracing.AttrOutcome].AsString())
	requireNoSecrets(t, sr.Ended(), body)
}

func TestObserver_StoreFailure_SetsErrorStatusAndRecordsTheError(t *testing.T) {
	t.Parallel()
	obs, sr, tracer := newTracing(t)
	s := newService(t, obs, tracer)
	_, err := s.DB.Exec("DROP TABLE idempotency_record") // the store now fails every statement
	require.NoError(t, err)
	body := obstest.MustJSON(t, obstest.OrderRequest{SKU: 20001, Quantity: 1, Note: secretNote})

	status, _ := s.Do(t, obstest.Call{Tenant: secretScope, Key: secretKey, Body: body})
	require.Equal(t, http.StatusServiceUnavailable, status)
	s.WaitServed(t, 1)

	tr := traces(t, sr)[0]
	require.ElementsMatch(t, []string{spanServer, tracing.SpanRequest, tracing.SpanClaim}, names(tr))
	for _, name := range []string{tracing.SpanRequest, tracing.SpanClaim} {
		span := tr[name]
		require.Equal(t, codes.Error, span.Status().Code, name)
		require.Contains(t, span.Status().Description, "idempotency_record", name)
		require.Equal(t, "store_error", attrs(span)[tracing.AttrOutcome].AsString(), name)
		require.Contains(t, eventNames(span), "exception", name)
	}
	require.Equal(t, int64(http.StatusServiceUnavailable), attrs(tr[tracing.SpanRequest])[tracing.AttrStatusCode].AsInt64())
	requireNoSecrets(t, sr.Ended(), body)
}

func TestObserver_ReconcilerOutcomes_AreEventsOnTheCallersSpan_WithKeyHashOnly(t *testing.T) {
	t.Parallel()
	obs, sr, tracer := newTracing(t)
	s := newService(t, obs, tracer)
	s.Abandon(t, secretScope, secretKey, "fp")

	ctx, span := tracer.Start(context.Background(), "test.reconcile")
	r := &idempotency.Reconciler{Store: s.Store, Observer: obs,
		Recover: func(context.Context, *idempotency.Record) (*idempotency.Snapshot, bool, error) {
			return nil, false, nil
		}}
	_, reclaimed, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, reclaimed)
	span.End()

	ended := sr.Ended()
	require.Len(t, ended, 1)
	events := ended[0].Events()
	require.Len(t, events, 1)
	require.Equal(t, "idempotency.reclaimed", events[0].Name)
	ea := map[attribute.Key]attribute.Value{}
	for _, kv := range events[0].Attributes {
		ea[kv.Key] = kv.Value
	}
	require.Equal(t, idempotency.KeyHash(secretScope, secretKey), ea[tracing.AttrKeyHash].AsString())
	require.Equal(t, int64(1), ea[tracing.AttrCount].AsInt64())
	requireNoSecrets(t, ended, "")
}

func TestObserver_StepStoreError_IsAnEventAndAnError_ItsFinalFormOnlySetsTheOutcome(t *testing.T) {
	t.Parallel()
	obs, sr, _ := newTracing(t)
	ctx, end := obs.StartStage(context.Background(), idempotency.StageRequest, "r")
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeStoreError, Err: context.DeadlineExceeded})
	obs.Observe(ctx, idempotency.Event{Route: "r", Outcome: idempotency.OutcomeRejected, Status: 422, Duration: time.Millisecond, Final: true})
	end(idempotency.StageEnd{Outcome: idempotency.OutcomeRejected, KeyHash: "abc"})
	end(idempotency.StageEnd{Outcome: idempotency.OutcomeCommitted}) // a second end is ignored

	ended := sr.Ended()
	require.Len(t, ended, 1)
	require.Equal(t, []string{"idempotency.store_error", "exception"}, eventNames(ended[0]))
	require.Equal(t, codes.Error, ended[0].Status().Code)
	a := attrs(ended[0])
	require.Equal(t, "rejected", a[tracing.AttrOutcome].AsString())
	require.Equal(t, "abc", a[tracing.AttrKeyHash].AsString())
	require.Equal(t, int64(422), a[tracing.AttrStatusCode].AsInt64())
}

func TestNew_NilProvider_UsesTheGlobalProvider(t *testing.T) {
	t.Parallel()
	obs := tracing.New(nil)
	ctx, end := obs.StartStage(context.Background(), idempotency.StageClaim, "r")
	require.NotNil(t, ctx)
	end(idempotency.StageEnd{})
	require.False(t, trace.SpanFromContext(ctx).SpanContext().IsValid(), "the default global provider records nothing")
	require.Equal(t, tracing.SpanClaim, tracing.SpanName(idempotency.StageClaim))
}
