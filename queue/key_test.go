package queue_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/queue"
)

// The default key is read as over HTTP, where one empty Idempotency-Key
// header is no key at all (and one of only spaces and tabs arrives empty):
// the message id stands in for it, as for a message without the header.
func TestTheDefaultKey_AnEmptyKeyHeaderIsNoKey_TheMessageIDStandsIn(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMySQLStore(nil), nil)
	require.NoError(t, err)
	p, err := queue.New("orders.create", queue.Config{Middleware: mw,
		Handler: func(context.Context, *sql.Tx, *queue.Message) idempotency.Result { return idempotency.Result{} }})
	require.NoError(t, err)
	key := p.Config().Key
	for _, tc := range []struct {
		name    string
		header  map[string][]string
		id      string
		want    string
		wantErr error
	}{
		{"no header: the message id", nil, "msg-1", "msg-1", nil},
		{"one empty header: the message id", map[string][]string{"Idempotency-Key": {""}}, "msg-1", "msg-1", nil},
		{"one header of spaces and tabs: the message id", map[string][]string{"Idempotency-Key": {" \t "}}, "msg-1", "msg-1", nil},
		{"one empty header, spelled in lower case: the message id", map[string][]string{"idempotency-key": {""}}, "msg-1", "msg-1", nil},
		{"one empty header and no message id: missing", map[string][]string{"Idempotency-Key": {""}}, "", "", idempotency.ErrMissingKey},
		{"a key: the key, over the id", map[string][]string{"Idempotency-Key": {"k1"}}, "msg-1", "k1", nil},
		{"a key in optional whitespace: the key", map[string][]string{"Idempotency-Key": {" k1\t"}}, "msg-1", "k1", nil},
		{"an empty quoted key: invalid, as over HTTP", map[string][]string{"Idempotency-Key": {`""`}}, "msg-1", "", idempotency.ErrInvalidKey},
		{"two headers, one empty: invalid", map[string][]string{"Idempotency-Key": {"", "k1"}}, "msg-1", "", idempotency.ErrInvalidKey},
		{"two empty headers: invalid", map[string][]string{"Idempotency-Key": {""}, "idempotency-key": {""}}, "msg-1", "", idempotency.ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := key(&queue.Message{Header: tc.header, ID: tc.id})
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
