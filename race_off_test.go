//go:build !race

package idempotency_test

const raceDetector = false
