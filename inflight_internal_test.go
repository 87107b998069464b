package idempotency

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestInflight_WaitersWakeWhenTheExecutionEnds(t *testing.T) {
	t.Parallel()
	f := inflight{waiters: map[string]chan struct{}{}}
	require.Nil(t, f.wait("s", "k"), "a key executing elsewhere has no local channel")

	done := f.begin("s", "k")
	wake := f.wait("s", "k")
	require.NotNil(t, wake)
	select {
	case <-wake:
		t.Fatal("woke before the execution ended")
	default:
	}
	require.Nil(t, f.wait("s", "kk"))
	require.Nil(t, f.wait("sk", ""), "scope and key are length-prefixed")

	done()
	select {
	case <-wake:
	default:
		t.Fatal("waiter not woken")
	}
	require.Nil(t, f.wait("s", "k"), "the registration is gone")
}

func TestInflight_LaterExecutionOfTheSameKeyIsNotUnregisteredByAnEarlierOne(t *testing.T) {
	t.Parallel()
	f := inflight{waiters: map[string]chan struct{}{}}
	first := f.begin("s", "k")
	second := f.begin("s", "k") // a takeover on the same instance
	first()
	require.NotNil(t, f.wait("s", "k"))
	second()
	require.Nil(t, f.wait("s", "k"))
}
