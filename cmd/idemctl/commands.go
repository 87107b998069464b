package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/orderguard/idempotency"
	"github.com/orderguard/idempotency/migrations"
	"github.com/orderguard/idempotency/postgres"
	"github.com/orderguard/idempotency/sqlite"
)

func (c *cli) migrate(ctx context.Context, args []string, dbURL string) error {
	fs := c.flagSet("migrate", &dbURL)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	d, err := c.open(ctx, dbURL, true)
	if err != nil {
		return err
	}
	defer d.Close()
	switch d.dialect {
	case "sqlite":
		err = sqlite.Migrate(ctx, d.db)
	case "postgres":
		err = postgres.Migrate(ctx, d.db)
	default:
		err = idempotency.Migrate(ctx, d.db)
	}
	if err != nil {
		return fmt.Errorf("migrate %s: %w", d.where, err)
	}
	list, err := migrations.List(d.dialect)
	if err != nil {
		return err
	}
	latest := list[len(list)-1]
	fmt.Fprintf(c.stdout, "migrated %s: schema at version %03d_%s\n", d.where, latest.Version, latest.Name)
	return nil
}

func (c *cli) stats(ctx context.Context, args []string, dbURL string) error {
	fs := c.flagSet("stats", &dbURL)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	d, err := c.open(ctx, dbURL, false)
	if err != nil {
		return err
	}
	defer d.Close()
	st, err := d.store.Stats(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.stdout, statsJSONOf(st))
	}
	writeStats(c.stdout, st, d.dialect)
	return nil
}

// recordFlags registers --scope and --key.
func recordFlags(fs *flag.FlagSet) (scope, key *string) {
	scope, key = new(string), new(string)
	fs.StringVar(scope, "scope", "", `the record's scope (default "", the scope of a middleware without a ScopeFunc)`)
	fs.StringVar(key, "key", "", "the idempotency key (required)")
	return scope, key
}

// lookup reads one record, turning "no row" into exit code 3.
func lookup(ctx context.Context, d *database, scope, key string) (*idempotency.Record, error) {
	rec, err := d.store.Lookup(ctx, scope, key)
	if errors.Is(err, idempotency.ErrRecordNotFound) {
		return nil, fail(exitNotFound, "no record for scope %q key %q in %s (never claimed, released, or purged)", scope, key, d.where)
	}
	return rec, err
}

func (c *cli) inspect(ctx context.Context, args []string, dbURL string) error {
	fs := c.flagSet("inspect", &dbURL)
	scope, key := recordFlags(fs)
	showBody := fs.Bool("body", false, "print the stored response body")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *key == "" {
		return fail(exitUsage, "--key is required")
	}
	d, err := c.open(ctx, dbURL, false)
	if err != nil {
		return err
	}
	defer d.Close()
	rec, err := lookup(ctx, d, *scope, *key)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.stdout, recordJSONOf(rec, *showBody))
	}
	writeRecord(c.stdout, rec, *showBody)
	return nil
}

func (c *cli) release(ctx context.Context, args []string, dbURL string) error {
	fs := c.flagSet("release", &dbURL)
	scope, key := recordFlags(fs)
	yes := fs.Bool("yes", false, "release without asking for confirmation")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *key == "" {
		return fail(exitUsage, "--key is required")
	}
	d, err := c.open(ctx, dbURL, false)
	if err != nil {
		return err
	}
	defer d.Close()
	rec, err := lookup(ctx, d, *scope, *key)
	if err != nil {
		return err
	}
	writeRecord(c.stdout, rec, false)
	if rec.Status != idempotency.StatusProcessing {
		return fail(exitRefused, "refusing to release: the record is %s, not PROCESSING; release only unsticks an attempt that never finished (a final record is replayed to retries, and purge removes it after its retention)", rec.Status)
	}

	fmt.Fprintf(c.stderr, "\nWARNING: releasing deletes this PROCESSING record, so the next retry with this key EXECUTES AGAIN.\n"+
		"Release only a key whose attempt is known to be dead AND whose effect (the order) is known to be absent;\n"+
		"otherwise let the reconciler decide: it looks for the effect before it releases or recovers the key.\n")
	if !rec.LeaseExpired {
		fmt.Fprintf(c.stderr, "The lease is still held until %s (%s): the attempt may still be running, and a retry would run alongside it.\n",
			fmtTime(rec.LockedUntil), relative(rec.LockedUntil, rec.ReadAt))
	}
	if !*yes {
		fmt.Fprintf(c.stderr, "Type yes to release scope %q key %q (owner %s, lease version %d): ", rec.Scope, rec.Key, rec.Owner, rec.Version)
		answer := make(chan string, 1)
		go func() {
			line, _ := bufio.NewReader(c.stdin).ReadString('\n')
			answer <- line
		}()
		select {
		case <-ctx.Done(): // the signal context: Ctrl-C at the prompt
			fmt.Fprintln(c.stderr)
			return fail(exitRefused, "not released: interrupted")
		case line := <-answer:
			fmt.Fprintln(c.stderr) // piped input is not echoed: end the prompt's line
			if strings.TrimSpace(line) != "yes" {
				return fail(exitRefused, "not released: the answer was not \"yes\"")
			}
		}
	}

	lease := idempotency.Lease{Scope: rec.Scope, Key: rec.Key, Owner: rec.Owner, Version: rec.Version}
	if err := d.store.Release(ctx, lease); err != nil {
		if errors.Is(err, idempotency.ErrLeaseLost) {
			return fail(exitRefused, "not released: the record changed since it was read (it is no longer PROCESSING under owner %s at lease version %d: finished, extended, taken over or released meanwhile); run idemctl inspect to see it now", rec.Owner, rec.Version)
		}
		return err
	}
	fmt.Fprintf(c.stdout, "released scope %q key %q (owner %s, lease version %d): the next retry with this key executes again\n", rec.Scope, rec.Key, rec.Owner, rec.Version)
	return nil
}

func (c *cli) purge(ctx context.Context, args []string, dbURL string) error {
	fs := c.flagSet("purge", &dbURL)
	olderThan := fs.Duration("older-than", 0, "delete final records created more than this long ago (a Go duration, e.g. 72h), whatever their retention; default: those past retention")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "older-than" })
	if explicit && *olderThan <= 0 {
		return fail(exitUsage, "--older-than must be a positive duration such as 72h, not %v", *olderThan)
	}
	d, err := c.open(ctx, dbURL, false)
	if err != nil {
		return err
	}
	defer d.Close()
	var n int64
	if explicit {
		n, err = d.store.PurgeOlderThan(ctx, *olderThan, defaultBatch)
	} else {
		n, err = idempotency.Purge(ctx, d.store, defaultBatch, nil)
	}
	if err != nil {
		return fmt.Errorf("purge stopped after deleting %d records: %w", n, err)
	}
	if explicit {
		fmt.Fprintf(c.stdout, "purged %d final records created more than %v ago\n", n, *olderThan)
	} else {
		fmt.Fprintf(c.stdout, "purged %d final records past their retention\n", n)
	}
	return nil
}

// defaultBatch is how many records one purge statement deletes.
const defaultBatch = 1000

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
