//go:build race

package chaintest

// raceDetector is whether the race detector is on: it runs a chain several
// times slower, so a run checks fewer chains (see Options.Chains).
const raceDetector = true
