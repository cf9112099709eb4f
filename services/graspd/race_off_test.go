//go:build !race

package graspd_test

// raceDetector: the race detector slows signature checks about twentyfold.
const raceDetector = false
