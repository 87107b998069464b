package faultproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The extended-protocol COMMIT: a Bind of a statement prepared with the text
// COMMIT, held with what follows it through the next Sync.

// pgMsg frames a typed frontend message whose payload is fields, joined.
func pgMsg(typ byte, fields ...[]byte) []byte {
	payload := bytes.Join(fields, nil)
	return append(binary.BigEndian.AppendUint32([]byte{typ}, uint32(4+len(payload))), payload...)
}

// pgStr is a string field: its bytes and a NUL.
func pgStr(s string) []byte { return append([]byte(s), 0) }

// pgInt16 is an int16 field.
func pgInt16(n int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(n)) }

// pgQ is a simple query.
func pgQ(q string) []byte { return pgMsg('Q', pgStr(q)) }

// pgParseMsg prepares query as statement name, with no parameter types.
func pgParseMsg(name, query string) []byte {
	return pgMsg('P', pgStr(name), pgStr(query), pgInt16(0))
}

// pgBindMsg binds statement name to the unnamed portal with params, in text
// format, and no result format codes.
func pgBindMsg(name string, params ...string) []byte {
	fields := [][]byte{pgStr(""), pgStr(name), pgInt16(0), pgInt16(len(params))}
	for _, p := range params {
		fields = append(fields, binary.BigEndian.AppendUint32(nil, uint32(len(p))), []byte(p))
	}
	return pgMsg('B', append(fields, pgInt16(0))...)
}

// pgDescribeStatementMsg asks for a statement's parameter and row
// descriptions; pgDescribePortalMsg for the unnamed portal's rows.
func pgDescribeStatementMsg(name string) []byte { return pgMsg('D', []byte{'S'}, pgStr(name)) }

var pgDescribePortalMsg = pgMsg('D', []byte{'P'}, pgStr(""))

// pgExecuteMsg runs the unnamed portal, without a row limit.
var pgExecuteMsg = pgMsg('E', pgStr(""), binary.BigEndian.AppendUint32(nil, 0))

var (
	pgFlushMsg = pgMsg('H')
	pgSyncMsg  = pgMsg('S')
)

// pgCloseMsg closes a statement (kind 'S') or a portal ('P').
func pgCloseMsg(kind byte, name string) []byte { return pgMsg('C', []byte{kind}, pgStr(name)) }

// pgxStatementName is the name pgx's statement cache prepares sql under.
func pgxStatementName(sql string) string {
	digest := sha256.Sum256([]byte(sql))
	return "stmtcache_" + hex.EncodeToString(digest[:24])
}

var pgStartupMsg = pgUntypedMessage(3<<16, "user\x00postgres\x00database\x00test\x00\x00")

func pgJoin(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// heldCommit is a COMMIT a framer returned: at which offset of the stream,
// the message and its statement.
type heldCommit struct {
	at        int
	msg       []byte
	statement string
}

// feedReads feeds f the reads one by one and returns what it forwarded, with
// each COMMIT in its place, and the COMMITs.
func feedReads(f framer, reads ...[]byte) (forwarded []byte, commits []heldCommit) {
	for _, r := range reads {
		out, commit := f.feed(r)
		for {
			forwarded = append(forwarded, out...)
			if commit == nil {
				break
			}
			commits = append(commits, heldCommit{len(forwarded), commit, f.statement(commit)})
			forwarded = append(forwarded, commit...)
			out, commit = f.feed(nil)
		}
	}
	return forwarded, commits
}

// A pgx connection in its default mode (cache statement) running the
// postgres store's last write: BEGIN, then SendBatch{INSERT, "commit"}. A
// batch first prepares, in a pipeline of its own, the statements the
// connection has not prepared yet (Parse and Describe of each, one Sync),
// then sends each statement as Bind, Describe of the portal (pgx knows no
// result columns for either), Execute, and ends the pipeline with one Sync.
var (
	pgxInsert  = "INSERT INTO ledger (idem_key) VALUES ($1)"
	pgxCommit  = "commit"
	pgxBegun   = pgJoin(pgStartupMsg, pgQ("begin"))
	pgxPrepare = pgJoin(
		pgParseMsg(pgxStatementName(pgxInsert), pgxInsert), pgDescribeStatementMsg(pgxStatementName(pgxInsert)),
		pgParseMsg(pgxStatementName(pgxCommit), pgxCommit), pgDescribeStatementMsg(pgxStatementName(pgxCommit)),
		pgSyncMsg)
	pgxInsertPart = pgJoin(pgBindMsg(pgxStatementName(pgxInsert), "k1"), pgDescribePortalMsg, pgExecuteMsg)
	pgxCommitPart = pgJoin(pgBindMsg(pgxStatementName(pgxCommit)), pgDescribePortalMsg, pgExecuteMsg, pgSyncMsg)
)

func TestPgFramer_PipelinedInsertAndCommit_HoldsTheCommitFromItsBindThroughTheSync_WhateverTheReadBoundaries(t *testing.T) {
	t.Parallel()
	batch := pgJoin(pgxInsertPart, pgxCommitPart) // one write
	stream := pgJoin(pgxBegun, pgxPrepare, batch)
	want := []heldCommit{{at: len(stream) - len(pgxCommitPart), msg: pgxCommitPart, statement: "commit"}}

	for cut := range len(batch) + 1 {
		forwarded, commits := feedReads(&pgFramer{}, pgxBegun, pgxPrepare, batch[:cut], batch[cut:])
		require.Equal(t, stream, forwarded, "cut at %d", cut)
		require.Equal(t, want, commits, "cut at %d", cut)
	}

	var bytewise [][]byte
	for i := range stream {
		bytewise = append(bytewise, stream[i:i+1])
	}
	forwarded, commits := feedReads(&pgFramer{}, bytewise...)
	require.Equal(t, stream, forwarded, "byte by byte")
	require.Equal(t, want, commits, "byte by byte")
}

func TestPgFramer_PipelinedInsertAndCommit_ForwardsTheInsertAtOnceAndWaitsForTheSync(t *testing.T) {
	t.Parallel()
	f := &pgFramer{}
	forwarded, commits := feedReads(f, pgxBegun, pgxPrepare)
	require.Equal(t, pgJoin(pgxBegun, pgxPrepare), forwarded, "a Parse of COMMIT is no COMMIT")
	require.Empty(t, commits)

	upToSync := pgJoin(pgxInsertPart, pgxCommitPart[:len(pgxCommitPart)-len(pgSyncMsg)])
	out, commit := f.feed(upToSync)
	require.Equal(t, pgxInsertPart, out, "the INSERT goes on; the COMMIT's Bind, Describe and Execute wait")
	require.Nil(t, commit)

	out, commit = f.feed(pgSyncMsg)
	require.Empty(t, out)
	require.Equal(t, pgxCommitPart, commit)
	require.Equal(t, "commit", f.statement(commit))
}

// pgx's SendQueryParams, and any client that does not prepare, sends the
// COMMIT through the unnamed statement: Parse, Bind, Describe, Execute in
// the same write.
func TestPgFramer_UnnamedStatementParsedInTheSameWrite_IsACommit(t *testing.T) {
	t.Parallel()
	parse := pgParseMsg("", "COMMIT;")
	commit := pgJoin(pgBindMsg(""), pgDescribePortalMsg, pgExecuteMsg, pgSyncMsg)
	stream := pgJoin(pgxBegun, pgParseMsg("", pgxInsert), pgBindMsg("", "k1"), pgDescribePortalMsg, pgExecuteMsg, parse, commit)

	for seed := range uint64(50) {
		forwarded, commits := feedReads(&pgFramer{}, randomReads(stream, seed)...)
		require.Equal(t, stream, forwarded)
		require.Equal(t, []heldCommit{{len(stream) - len(commit), commit, "COMMIT;"}}, commits, "seed %d", seed)
	}
}

// randomReads cuts stream into reads of 1 to 16 bytes.
func randomReads(stream []byte, seed uint64) [][]byte {
	r := rand.New(rand.NewPCG(seed, 7))
	var reads [][]byte
	for len(stream) > 0 {
		n := min(len(stream), 1+r.IntN(16))
		reads, stream = append(reads, stream[:n]), stream[n:]
	}
	return reads
}

// Which Binds are a COMMIT: what the statements the connection prepared and
// closed make of them.
func TestPgFramer_ABindIsACommitWhenItsStatementWasLastParsedAsCommit(t *testing.T) {
	t.Parallel()
	run := func(name string) []byte { return pgJoin(pgBindMsg(name), pgExecuteMsg, pgSyncMsg) }
	long := strings.Repeat("n", pgNameLen)
	tests := []struct {
		name    string
		stream  []byte
		commits []string
	}{
		{"a statement of COMMIT, in any case, trimmed",
			pgJoin(pgParseMsg("s", " Commit ;\n"), pgSyncMsg, run("s")), []string{" Commit ;\n"}},
		{"a statement of other text",
			pgJoin(pgParseMsg("s", "SELECT 1"), pgSyncMsg, run("s")), nil},
		{"a statement that merely contains COMMIT",
			pgJoin(pgParseMsg("s", "COMMIT; SELECT 1"), pgParseMsg("t", "SELECT 'COMMIT'"), pgSyncMsg, run("s"), run("t")), nil},
		{"a statement never parsed",
			run("s"), nil},
		{"the unnamed statement parsed anew with other text",
			pgJoin(pgParseMsg("", "commit"), pgSyncMsg, pgParseMsg("", "SELECT 1"), run("")), nil},
		{"the unnamed statement parsed anew as COMMIT",
			pgJoin(pgParseMsg("", "SELECT 1"), pgSyncMsg, pgParseMsg("", "commit"), run("")), []string{"commit"}},
		{"the unnamed statement parsed anew by a Parse too large to be a COMMIT",
			pgJoin(pgParseMsg("", "commit"), pgSyncMsg, pgParseMsg("", "SELECT '"+strings.Repeat("x", 1000)+"'"), run("")), nil},
		{"the unnamed statement after a simple query, which destroys it",
			pgJoin(pgParseMsg("", "commit"), pgSyncMsg, pgQ("SELECT 1"), run("")), nil},
		{"a named statement after a simple query",
			pgJoin(pgParseMsg("s", "commit"), pgSyncMsg, pgQ("SELECT 1"), run("s")), []string{"commit"}},
		{"a statement closed",
			pgJoin(pgParseMsg("s", "commit"), pgSyncMsg, pgCloseMsg('S', "s"), pgSyncMsg, run("s")), nil},
		{"a statement closed and parsed anew with other text",
			pgJoin(pgParseMsg("s", "commit"), pgSyncMsg, pgCloseMsg('S', "s"), pgParseMsg("s", "SELECT 1"), pgSyncMsg, run("s")), nil},
		{"a statement after a portal of its name was closed",
			pgJoin(pgParseMsg("s", "commit"), pgSyncMsg, pgCloseMsg('P', "s"), pgSyncMsg, run("s")), []string{"commit"}},
		{"another statement closed",
			pgJoin(pgParseMsg("s", "commit"), pgSyncMsg, pgCloseMsg('S', "t"), pgSyncMsg, run("s")), []string{"commit"}},
		{"each statement as it was parsed, every time it runs",
			pgJoin(pgParseMsg("c", "commit"), pgParseMsg("s", "SELECT 1"), pgSyncMsg, run("s"), run("c"), run("s"), run("c")), []string{"commit", "commit"}},
		{"a name as PostgreSQL keys it, by its first 63 bytes",
			pgJoin(pgParseMsg(long+"a", "commit"), pgSyncMsg, run(long+"b")), []string{"commit"}},
		{"a name that differs within its first 63 bytes",
			pgJoin(pgParseMsg(long[1:]+"a", "commit"), pgSyncMsg, run(long[1:]+"b")), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stream := pgJoin(pgxBegun, tt.stream)
			for seed := range uint64(20) {
				forwarded, commits := feedReads(&pgFramer{}, randomReads(stream, seed)...)
				require.Equal(t, stream, forwarded)
				var statements []string
				for _, c := range commits {
					statements = append(statements, c.statement)
				}
				require.Equal(t, tt.commits, statements, "seed %d", seed)
			}
		})
	}
}

// What may come between a COMMIT's Bind and its Sync: Describe, Execute and
// Flush, a few. Anything else makes the Bind and what followed it an
// ordinary part of the stream, and the framer goes on from there.
func TestPgFramer_ACommitsBindIsHeldOnlyUntilSomethingOtherThanDescribeExecuteOrFlushComes(t *testing.T) {
	t.Parallel()
	prepared := pgJoin(pgxBegun, pgParseMsg("c", "commit"), pgParseMsg("s", "SELECT 1"), pgSyncMsg)
	bind := pgBindMsg("c")
	tests := []struct {
		name   string
		stream []byte
		commit []byte // nil for none
	}{
		{"Describe, Execute, Flush, Sync",
			pgJoin(bind, pgDescribePortalMsg, pgExecuteMsg, pgFlushMsg, pgSyncMsg),
			pgJoin(bind, pgDescribePortalMsg, pgExecuteMsg, pgFlushMsg, pgSyncMsg)},
		{"Sync at once",
			pgJoin(bind, pgSyncMsg), pgJoin(bind, pgSyncMsg)},
		{"another statement's Bind before the Sync",
			pgJoin(bind, pgExecuteMsg, pgBindMsg("s"), pgExecuteMsg, pgSyncMsg), nil},
		{"a second COMMIT's Bind before the Sync: that one is the COMMIT",
			pgJoin(bind, pgExecuteMsg, bind, pgExecuteMsg, pgSyncMsg), pgJoin(bind, pgExecuteMsg, pgSyncMsg)},
		{"a simple query before the Sync",
			pgJoin(bind, pgExecuteMsg, pgQ("SELECT 1"), pgSyncMsg), nil},
		{"a Parse before the Sync",
			pgJoin(bind, pgExecuteMsg, pgParseMsg("t", "SELECT 2"), pgSyncMsg), nil},
		{"more than pgMaxCommitGroup bytes before the Sync",
			pgJoin(bind, bytes.Repeat(pgFlushMsg, pgMaxCommitGroup/len(pgFlushMsg)), pgSyncMsg), nil},
		{"a Sync with a payload",
			pgJoin(bind, pgExecuteMsg, pgMsg('S', []byte{0}), pgSyncMsg), nil},
		{"a Bind with parameters, too large to be a COMMIT",
			pgJoin(pgBindMsg("c", strings.Repeat("p", pgMaxExtended)), pgExecuteMsg, pgSyncMsg), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stream := pgJoin(prepared, tt.stream)
			var want []heldCommit
			if tt.commit != nil {
				want = []heldCommit{{len(stream) - len(tt.commit), tt.commit, "commit"}}
			}
			for seed := range uint64(20) {
				forwarded, commits := feedReads(&pgFramer{}, randomReads(stream, seed)...)
				require.Equal(t, stream, forwarded)
				require.Equal(t, want, commits, "seed %d", seed)
			}
		})
	}
}

// Messages that cannot be a COMMIT are forwarded as they arrive: a Bind of
// another statement at once, however the pipeline goes on; of a large Parse
// no more than its start, which holds its name.
func TestPgFramer_WhatCannotBeACommit_IsForwardedAsItArrives(t *testing.T) {
	t.Parallel()
	f := &pgFramer{}
	feedReads(f, pgxBegun, pgxPrepare)

	insert := pgJoin(pgBindMsg(pgxStatementName(pgxInsert), "k1"), pgDescribePortalMsg, pgExecuteMsg)
	out, commit := f.feed(insert)
	require.Equal(t, insert, out, "a Bind of the INSERT, with no Sync yet")
	require.Nil(t, commit)

	large := pgParseMsg("", "INSERT INTO t VALUES ('"+strings.Repeat("x", 100<<10)+"')")
	out, commit = f.feed(large[:5+pgMaxExtended])
	require.Equal(t, large[:5+pgMaxExtended], out, "a large Parse once its name is known")
	require.Nil(t, commit)
	out, commit = f.feed(large[5+pgMaxExtended:])
	require.Equal(t, large[5+pgMaxExtended:], out)
	require.Nil(t, commit)
}

// Prepared statements belong to a connection: a statement prepared as
// COMMIT on one is nothing on another.
func TestPgFramer_CommitStatementsArePerConnection(t *testing.T) {
	t.Parallel()
	_, commits := feedReads(&pgFramer{}, pgxBegun, pgxPrepare)
	require.Empty(t, commits)
	forwarded, commits := feedReads(&pgFramer{}, pgxBegun, pgxInsertPart, pgxCommitPart)
	require.Equal(t, pgJoin(pgxBegun, pgxInsertPart, pgxCommitPart), forwarded)
	require.Empty(t, commits, "the other connection never prepared it")
}

// Once the stream is not the plain protocol, nothing is a COMMIT, whatever
// the statements prepared before.
func TestPgFramer_AfterTheStreamTurnsOpaque_NoExtendedCommitIsFound(t *testing.T) {
	t.Parallel()
	malformed := []byte{'X', 0, 0, 0, 1}
	stream := pgJoin(pgxBegun, pgxPrepare, malformed, pgxInsertPart, pgxCommitPart)
	forwarded, commits := feedReads(&pgFramer{}, randomReads(stream, 1)...)
	require.Equal(t, stream, forwarded)
	require.Empty(t, commits)
}
