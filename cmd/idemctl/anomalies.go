package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/orderguard/idempotency"
)

// defaultAnomalyLimit is how many anomalies anomalies lists without --limit.
const defaultAnomalyLimit = 100

// orders is the order store's SQL in the database's dialect.
func (d *database) orders() idempotency.Orders {
	switch d.dialect {
	case "postgres":
		return idempotency.PostgresOrders
	case "sqlite":
		return idempotency.SQLiteOrders
	default:
		return idempotency.MySQLOrders
	}
}

func (c *cli) anomalies(ctx context.Context, args []string, dbURL string) error {
	fs := c.flagSet("anomalies", &dbURL)
	limit := fs.Int("limit", defaultAnomalyLimit, "list at most this many, newest first")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *limit <= 0 {
		return fail(exitUsage, "--limit must be a positive number, not %d", *limit)
	}
	d, err := c.open(ctx, dbURL, false)
	if err != nil {
		return err
	}
	defer d.Close()
	list, err := d.orders().ListAnomalies(ctx, d.db, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]anomalyJSON, 0, len(list))
		for _, a := range list {
			out = append(out, anomalyJSONOf(a))
		}
		return writeJSON(c.stdout, out)
	}
	writeAnomalies(c.stdout, list, d.where)
	return nil
}

// anomalyJSON is one element of anomalies --json.
type anomalyJSON struct {
	Reason      string    `json:"reason"`
	Provider    string    `json:"provider"`
	EventID     string    `json:"event_id"` // for refund-owed, the payment's success event
	Kind        string    `json:"kind"`
	PaymentID   string    `json:"payment_id"`
	OrderNo     string    `json:"order_no"`     // "" when the event named none
	AmountCents int64     `json:"amount_cents"` // for refund-owed, the amount owed
	Currency    string    `json:"currency"`
	Digest      string    `json:"digest"`
	At          time.Time `json:"at"` // for refund-owed, when the order last changed
}

func anomalyJSONOf(a idempotency.PaymentAnomaly) anomalyJSON {
	return anomalyJSON{
		Reason: string(a.Reason), Provider: a.Provider, EventID: a.EventID, Kind: string(a.Kind),
		PaymentID: a.PaymentID, OrderNo: a.OrderNo, AmountCents: a.AmountCents, Currency: a.Currency,
		Digest: a.Digest, At: a.At,
	}
}

// writeAnomalies prints one line per anomaly under a header, newest first.
func writeAnomalies(w io.Writer, list []idempotency.PaymentAnomaly, where string) {
	if len(list) == 0 {
		fmt.Fprintf(w, "no payment anomalies in %s\n", where)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WHEN\tREASON\tPROVIDER\tEVENT\tKIND\tPAYMENT\tORDER\tAMOUNT\tCURRENCY")
	for _, a := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", fmtTime(a.At), a.Reason, a.Provider,
			orDash(a.EventID), a.Kind, a.PaymentID, orDash(a.OrderNo), a.AmountCents, a.Currency)
	}
	tw.Flush() //nolint:errcheck // as fmt.Fprint's results above
	fmt.Fprintf(w, "%d anomalies (amounts in minor units; refund-owed is the amount still owed)\n", len(list))
}

// orDash prints an empty field as "-", so that the table keeps its columns.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
