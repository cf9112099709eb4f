package fetcher

import "time"

// SetReportAttemptTimeout shortens how long one report publish waits for
// its acknowledgement, so that a test's outage outlasts decision 0048's
// five attempts in seconds, not half a minute. It returns the restore.
func SetReportAttemptTimeout(d time.Duration) (restore func()) {
	old := reportAttemptTimeout
	reportAttemptTimeout = d
	return func() { reportAttemptTimeout = old }
}
