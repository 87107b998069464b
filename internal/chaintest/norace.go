//go:build !race

package chaintest

const raceDetector = false
