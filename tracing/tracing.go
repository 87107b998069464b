// Package tracing records the idempotency middleware's stages as
// OpenTelemetry spans.
//
// An *Observer implements idempotency.Observer and idempotency.StageObserver.
// Hand it to a Middleware as its Observer; wrap the middleware in the HTTP
// server instrumentation (otelhttp) so that the request span below becomes a
// child of the server span:
//
//	obs := tracing.New(otel.GetTracerProvider())
//	mw, err := idempotency.New(store, &idempotency.Config{Route: "create_order", Observer: obs})
//	if err != nil {
//		return err
//	}
//	http.Handle("POST /orders", otelhttp.NewHandler(mw.Handler(createOrder), "create_order"))
//
// Each request gets one span named "idempotency.request" (StageRequest), with
// children "idempotency.claim", "idempotency.execute", "idempotency.finalize"
// and "idempotency.replay" for the stages it went through. The handler runs
// with the execute span in its context, so its own spans (SQL, outgoing
// calls) are children of it.
//
// Attributes, on every span:
//
//   - idempotency.route: Config.Route.
//
// On the span of the stage that reports them (the request span gets the
// final ones):
//
//   - idempotency.outcome: the final outcome on the request span (committed,
//     replayed, conflict, ...); claimed or taken_over on the claim span that
//     won the key; store_error on a stage that failed.
//   - idempotency.record.status: the record's status as the stage left or
//     found it (PROCESSING, DONE, FAILED); on the request span of a replay,
//     the replayed record's status.
//   - idempotency.key_hash: idempotency.KeyHash of the scope and key. The raw
//     key, the scope and the request body are never recorded.
//   - http.response.status_code: on the request span, the status answered.
//
// Step outcomes (claimed, taken_over, lease_lost, store_error) are added as
// span events named "idempotency.<outcome>" to the request span. Reconciler
// and Purge outcomes become events ("idempotency.recovered",
// "idempotency.reclaimed", "idempotency.purged", with idempotency.count and,
// per record, idempotency.key_hash) on whatever span their context carries.
//
// Errors reported with a stage or a step are recorded on the span
// (RecordError) and set its status to Error, with the error's message. The
// errors the middleware reports never contain the raw key or the body (bad
// input is rejected without an error attached); a message that a database
// driver, a custom Store or a handler's panic value puts in one is recorded
// as is. Answers such as conflict, in_progress or a handler's 5xx (released)
// are outcomes, not errors: their spans keep status Unset.
package tracing

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderguard/idempotency"
)

// ScopeName is the instrumentation scope name of the tracer.
const ScopeName = "github.com/orderguard/idempotency/tracing"

// Span names, one per stage.
const (
	SpanRequest  = "idempotency.request"
	SpanClaim    = "idempotency.claim"
	SpanExecute  = "idempotency.execute"
	SpanFinalize = "idempotency.finalize"
	SpanReplay   = "idempotency.replay"
)

// Attribute keys.
const (
	AttrRoute        = attribute.Key("idempotency.route")
	AttrOutcome      = attribute.Key("idempotency.outcome")
	AttrRecordStatus = attribute.Key("idempotency.record.status")
	AttrKeyHash      = attribute.Key("idempotency.key_hash")
	AttrCount        = attribute.Key("idempotency.count")
	AttrStatusCode   = attribute.Key("http.response.status_code")
)

// Observer turns the middleware's stages into spans and its steps into span
// events. It implements idempotency.Observer and idempotency.StageObserver
// and is safe for concurrent use. Create it with New.
type Observer struct {
	tracer trace.Tracer
}

var (
	_ idempotency.Observer      = (*Observer)(nil)
	_ idempotency.StageObserver = (*Observer)(nil)
)

// New returns an Observer whose spans come from tp; a nil tp means the
// global provider, otel.GetTracerProvider().
func New(tp trace.TracerProvider) *Observer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Observer{tracer: tp.Tracer(ScopeName)}
}

// SpanName returns the span name of a stage: "idempotency." + the stage.
func SpanName(s idempotency.Stage) string { return "idempotency." + string(s) }

// StartStage implements idempotency.StageObserver: it starts a span named
// SpanName(s) as a child of the span in ctx and returns ctx carrying it. The
// returned function records the stage's outcome, record status, key hash and
// error, and ends the span; calls after the first do nothing.
func (o *Observer) StartStage(ctx context.Context, s idempotency.Stage, route string) (context.Context, func(idempotency.StageEnd)) {
	ctx, span := o.tracer.Start(ctx, SpanName(s),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrRoute.String(route)))
	var ended atomic.Bool
	return ctx, func(end idempotency.StageEnd) {
		if !ended.CompareAndSwap(false, true) {
			return
		}
		if end.Outcome != "" {
			span.SetAttributes(AttrOutcome.String(string(end.Outcome)))
		}
		if end.Record != "" {
			span.SetAttributes(AttrRecordStatus.String(string(end.Record)))
		}
		if end.KeyHash != "" {
			span.SetAttributes(AttrKeyHash.String(end.KeyHash))
		}
		if end.Err != nil {
			span.RecordError(end.Err)
			span.SetStatus(codes.Error, end.Err.Error())
		}
		span.End()
	}
}

// Observe implements idempotency.Observer on the span in ctx, which for the
// middleware's events is the request span.
//
// A step (claimed, taken_over, and lease_lost or store_error without a
// Duration) becomes a span event "idempotency.<outcome>"; its error, if any,
// is recorded and sets the span's status to Error. A request's final event
// sets idempotency.outcome, http.response.status_code and, for a replay,
// idempotency.record.status; its error is recorded when the request stage
// ends, not here, so that it is recorded once. Reconciler and Purge events
// become span events with their count.
func (o *Observer) Observe(ctx context.Context, e idempotency.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	switch {
	case e.Outcome == idempotency.OutcomeRecovered || e.Outcome == idempotency.OutcomeReclaimed ||
		e.Outcome == idempotency.OutcomePurged:
		attrs := []attribute.KeyValue{AttrOutcome.String(string(e.Outcome)), AttrCount.Int64(e.Count)}
		if e.KeyHash != "" {
			attrs = append(attrs, AttrKeyHash.String(e.KeyHash))
		}
		span.AddEvent("idempotency."+string(e.Outcome), trace.WithAttributes(attrs...))
	case isStep(e):
		span.AddEvent("idempotency."+string(e.Outcome),
			trace.WithAttributes(AttrOutcome.String(string(e.Outcome))))
		if e.KeyHash != "" {
			span.SetAttributes(AttrKeyHash.String(e.KeyHash))
		}
		if e.Err != nil {
			span.RecordError(e.Err)
			span.SetStatus(codes.Error, e.Err.Error())
		}
	default:
		attrs := []attribute.KeyValue{AttrOutcome.String(string(e.Outcome))}
		if e.Status != 0 {
			attrs = append(attrs, AttrStatusCode.Int(e.Status))
		}
		if e.Replayed != "" {
			attrs = append(attrs, AttrRecordStatus.String(string(e.Replayed)))
		}
		if e.KeyHash != "" {
			attrs = append(attrs, AttrKeyHash.String(e.KeyHash))
		}
		span.SetAttributes(attrs...)
	}
}

// isStep tells a request's step events from its one final event.
func isStep(e idempotency.Event) bool {
	return !e.Final
}
