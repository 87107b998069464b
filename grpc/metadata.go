package idemgrpc

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// PushbackKey is the trailer metadata in which grpc-go's retry policy
// (a service config's retryPolicy) reads how long the server asks it to
// wait, in milliseconds, before the next attempt. grpc-go reads it only
// from an answer without header metadata (trailers only), which is what
// the interceptor's own answers are.
const PushbackKey = "grpc-retry-pushback-ms"

// headerCapture is the call's stream as a run of the handler sees it: the
// header metadata it sets (grpc.SetHeader, grpc.SendHeader) is kept, to be
// recorded with its answer and sent after the protocol has answered, not
// sent at once. A run that the protocol rolls back and runs again
// (ModeSinglePhase) has a capture of its own, so only the answered run's
// header metadata is sent. Trailers pass straight through.
type headerCapture struct {
	grpc.ServerTransportStream // nil when the call has no stream (a direct call in a test)
	method                     string

	mu     sync.Mutex
	header metadata.MD
	sent   bool
}

// captureHeader returns ctx with a new capture in place of the call's
// stream.
func captureHeader(ctx context.Context, method string) (context.Context, *headerCapture) {
	c := &headerCapture{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx), method: method}
	return grpc.NewContextWithServerTransportStream(ctx, c), c
}

// errHeaderSent is what grpc-go answers a header set after it was sent.
var errHeaderSent = errors.New("idemgrpc: the header metadata was already sent (grpc.SendHeader)")

func (c *headerCapture) Method() string {
	if c.ServerTransportStream != nil {
		return c.ServerTransportStream.Method()
	}
	return c.method
}

func (c *headerCapture) SetHeader(md metadata.MD) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent {
		return errHeaderSent
	}
	c.header = metadata.Join(c.header, md)
	return nil
}

// SendHeader keeps md as SetHeader does: a unary call's header metadata
// reaches the client with its answer either way.
func (c *headerCapture) SendHeader(md metadata.MD) error {
	if err := c.SetHeader(md); err != nil {
		return err
	}
	c.mu.Lock()
	c.sent = true
	c.mu.Unlock()
	return nil
}

func (c *headerCapture) SetTrailer(md metadata.MD) error {
	if c.ServerTransportStream == nil {
		return errors.New("idemgrpc: the call has no stream to set trailers on")
	}
	return c.ServerTransportStream.SetTrailer(md)
}

// recorded is the captured header metadata with http.CanonicalHeaderKey
// keys, as idempotency.Result.Header holds it.
func (c *headerCapture) recorded() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := make(map[string][]string, len(c.header))
	for k, v := range c.header {
		if strings.HasSuffix(k, "-bin") {
			continue // binary metadata is not an HTTP header: not recorded
		}
		ck := http.CanonicalHeaderKey(k)
		h[ck] = append(h[ck], v...)
	}
	return h
}

// send sends the captured header metadata with the call's answer.
func (c *headerCapture) send(ctx context.Context) {
	c.mu.Lock()
	md := c.header
	c.mu.Unlock()
	if len(md) > 0 {
		_ = grpc.SetHeader(ctx, md)
	}
}

// replayedHeader is a recorded answer's header metadata for its replay: its
// recorded headers with lower-case keys (Location, ETag and
// Config.ReplayHeaders: the ones the record keeps), and ReplayedKey.
// Content-Type, which describes the recorded body, and what gRPC reserves
// or cannot carry are left out.
func replayedHeader(recorded map[string][]string) metadata.MD {
	md := metadata.Pairs(ReplayedKey, "true")
	for k, vs := range recorded {
		key := strings.ToLower(k)
		if key == "content-type" || key == ReplayedKey || strings.HasPrefix(key, "grpc-") || !validMetadataKey(key) {
			continue
		}
		for _, v := range vs {
			if validMetadataValue(v) {
				md.Append(key, v)
			}
		}
	}
	return md
}

// validMetadataKey and validMetadataValue are gRPC's rules for ASCII
// metadata, which an HTTP header need not follow.
func validMetadataKey(k string) bool {
	if k == "" || strings.HasSuffix(k, "-bin") {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func validMetadataValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// setPushback sets PushbackKey in the trailer of an answer whose status
// carries a RetryInfo, so that grpc-go's retry policy waits the delay the
// problem asks for (Problem.RetryAfter) instead of its own backoff.
func setPushback(ctx context.Context, err error) {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			ms := ri.GetRetryDelay().AsDuration().Milliseconds()
			if ms >= 0 {
				_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, strconv.FormatInt(ms, 10)))
			}
			return
		}
	}
}
