package config

import "time"

// SetIdleTrimAfter sets how long the guard waits for quiet (IdleTrim) and
// returns what restores it.
func SetIdleTrimAfter(d time.Duration) (restore func()) {
	old := idleTrimAfter
	idleTrimAfter = d
	return func() { idleTrimAfter = old }
}
