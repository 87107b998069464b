//go:build race

package idempotency_test

// raceDetector is whether the race detector is on: specs whose subject is
// scale, not data races, run smaller under it.
const raceDetector = true
