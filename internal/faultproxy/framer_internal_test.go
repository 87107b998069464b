package faultproxy

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// feedAll feeds stream to f in pieces cut by r (whole when r is nil) and
// returns what it forwarded, with each COMMIT held back in its place, and
// the COMMITs.
func feedAll(f framer, stream []byte, r *rand.Rand) (forwarded []byte, commits []string) {
	for len(stream) > 0 {
		n := len(stream)
		if r != nil {
			n = min(n, 1+r.IntN(16))
		}
		out, commit := f.feed(stream[:n])
		stream = stream[n:]
		for {
			forwarded = append(forwarded, out...)
			if commit == nil {
				break
			}
			commits = append(commits, f.statement(commit))
			forwarded = append(forwarded, commit...)
			out, commit = f.feed(nil)
		}
	}
	return forwarded, commits
}

// pgUntypedMessage frames a startup-phase message.
func pgUntypedMessage(code uint32, rest string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(rest)))
	return append(binary.BigEndian.AppendUint32(b, code), rest...)
}

// The framers' invariant: every byte is forwarded once and in order (but
// for the start of a message whose header or candidate COMMIT is
// incomplete, which waits for more: for PostgreSQL, a COMMIT's Bind and
// what followed it, waiting for the Sync, and the header of the message
// after them), and what is forwarded and the COMMITs found do not depend on
// where reads end.
func FuzzFramer_ForwardsEveryByteInOrderAndFindsTheSameCommitsWhateverTheReadBoundaries(f *testing.F) {
	pgStart := pgUntypedMessage(3<<16, "user\x00postgres\x00\x00")
	pgSSL := pgUntypedMessage(pgSSLRequest, "")
	myQ := func(q string) []byte {
		n := 1 + len(q)
		return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), 0, comQuery}, q...)
	}
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

	f.Add(uint8(PostgreSQL), join(pgSSL, pgStart, pgQ("begin"), pgQ("commit"), pgQ(" COMMIT ; ")), uint64(1))
	f.Add(uint8(PostgreSQL), join(pgStart, pgQ(string(bytes.Repeat([]byte("y"), 500))), pgQ("COMMIT")), uint64(2))
	f.Add(uint8(PostgreSQL), join(pgSSL, []byte{0x16, 0x03, 0x01, 0x00, 0x10}, pgQ("COMMIT")), uint64(3))
	// The extended protocol: pgx's pipelined INSERT and COMMIT, the unnamed
	// statement, a redefined and a closed statement, a held group broken off.
	f.Add(uint8(PostgreSQL), join(pgxBegun, pgxPrepare, pgxInsertPart, pgxCommitPart), uint64(6))
	f.Add(uint8(PostgreSQL), join(pgStart, pgParseMsg("", "commit"), pgBindMsg(""), pgDescribePortalMsg, pgExecuteMsg, pgFlushMsg, pgSyncMsg), uint64(7))
	f.Add(uint8(PostgreSQL), join(pgStart, pgParseMsg("", "commit"), pgSyncMsg, pgParseMsg("", "SELECT 1"), pgBindMsg(""), pgExecuteMsg, pgSyncMsg), uint64(8))
	f.Add(uint8(PostgreSQL), join(pgStart, pgParseMsg("s", "commit"), pgCloseMsg('S', "s"), pgBindMsg("s"), pgExecuteMsg, pgSyncMsg), uint64(9))
	f.Add(uint8(PostgreSQL), join(pgStart, pgParseMsg("s", "commit"), pgBindMsg("s"), pgExecuteMsg, pgQ("SELECT 1"), pgBindMsg("s"), pgSyncMsg), uint64(10))
	f.Add(uint8(MySQL), join(myQ("SELECT 1"), myQ("COMMIT"), myQ("commit;")), uint64(4))
	f.Add(uint8(MySQL), join(myQ(string(bytes.Repeat([]byte("z"), 300))), myQ("COMMIT")), uint64(5))
	maxWaiting := map[Protocol]int{MySQL: 5 + maxCandidate, PostgreSQL: pgMaxCommitGroup + 5}
	f.Fuzz(func(t *testing.T, protocol uint8, stream []byte, seed uint64) {
		p := Protocol(protocol % 2)
		whole, commits := feedAll(p.newFramer(), stream, nil)
		require.True(t, bytes.HasPrefix(stream, whole), "forwarded in order")
		require.LessOrEqual(t, len(stream)-len(whole), maxWaiting[p], "only an incomplete header or candidate waits")
		split, splitCommits := feedAll(p.newFramer(), stream, rand.New(rand.NewPCG(seed, seed)))
		require.Equal(t, whole, split)
		require.Equal(t, commits, splitCommits)
	})
}

func TestPgFramer_FindsTheCommitsOfAPgxSession(t *testing.T) {
	t.Parallel()
	startup := pgUntypedMessage(3<<16, "user\x00postgres\x00\x00")
	ssl := pgUntypedMessage(pgSSLRequest, "")
	password := append(binary.BigEndian.AppendUint32([]byte{'p'}, 4+7), "secret\x00"...)
	stream := bytes.Join([][]byte{ssl, startup, password, pgQ("begin"), pgQ("commit"), pgQ("begin"), pgQ("rollback"), pgQ("COMMIT")}, nil)
	for seed := range uint64(50) {
		forwarded, commits := feedAll(&pgFramer{}, stream, rand.New(rand.NewPCG(seed, 1)))
		require.Equal(t, stream, forwarded)
		require.Equal(t, []string{"commit", "COMMIT"}, commits, "seed %d", seed)
	}
}
