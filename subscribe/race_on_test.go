//go:build race

package subscribe_test

// raceEnabled: the race detector is on, and the property tests run fewer
// seeds (it slows them about tenfold).
const raceEnabled = true
