package payment

import (
	"net/http"
	"strings"
)

// HeaderValue returns the first non-empty value of the header name, its
// key matched ignoring case even in a header map not built by net/http
// (a queued message's headers, as a bridge forwarded them).
func HeaderValue(h http.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	for key, values := range h {
		if strings.EqualFold(key, name) && len(values) > 0 && values[0] != "" {
			return values[0]
		}
	}
	return ""
}

// RefusePlain answers status with message as plain text, the refusal of
// providers that read only the status (Stripe, Standard Webhooks). A status
// outside 4xx and 5xx is written as 500, since a refusal is never a
// success.
func RefusePlain(w http.ResponseWriter, status int, message string) {
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(message + "\n"))
}
