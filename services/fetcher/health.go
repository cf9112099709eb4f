package fetcher

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"syscall"
	"time"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

// HealthPolicy is the reconnect schedule of a relay: backoff
// Base × 2^(n−1) capped at Max (hourly after the cap with the defaults),
// Dead after DeadAfter of continuous failure, then one attempt every
// DeadRetry. A session that lasted StableAfter ends a failure streak.
type HealthPolicy struct {
	Base, Max   time.Duration
	DeadAfter   time.Duration
	DeadRetry   time.Duration
	StableAfter time.Duration
}

// DefaultHealthPolicy is the schedule of docs/sync.md, "Health and rate limits".
func DefaultHealthPolicy() HealthPolicy {
	return HealthPolicy{Base: 5 * time.Second, Max: time.Hour, DeadAfter: 24 * time.Hour, DeadRetry: 24 * time.Hour, StableAfter: time.Minute}
}

// RelayHealth tracks one relay's failure streak. It is pure: the caller
// passes the time, so the schedule is tested without waiting.
type RelayHealth struct {
	Policy       HealthPolicy
	Failures     int
	FailingSince time.Time
	ConnectedAt  time.Time
	State        graspv1.HealthState
}

// Connected records a successful connection.
func (h *RelayHealth) Connected(now time.Time) {
	h.ConnectedAt = now
	h.State = graspv1.HealthState_HEALTH_STATE_HEALTHY
}

// Failed records a failed attempt or a lost session and returns how long to
// wait before the next attempt and the resulting state.
func (h *RelayHealth) Failed(now time.Time) (time.Duration, graspv1.HealthState) {
	if !h.ConnectedAt.IsZero() && now.Sub(h.ConnectedAt) >= h.Policy.StableAfter {
		// The last session was healthy: this is a new streak.
		h.Failures = 0
	}
	h.ConnectedAt = time.Time{}
	if h.Failures == 0 {
		h.FailingSince = now
	}
	h.Failures++
	if h.Policy.DeadAfter > 0 && now.Sub(h.FailingSince) >= h.Policy.DeadAfter {
		h.State = graspv1.HealthState_HEALTH_STATE_DEAD
		return h.Policy.DeadRetry, h.State
	}
	h.State = graspv1.HealthState_HEALTH_STATE_BACKING_OFF
	return Backoff(h.Policy.Base, h.Policy.Max, h.Failures), h.State
}

// Backoff is base × 2^(n−1), capped at limit (n counts from 1).
func Backoff(base, limit time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Failure classes, used in metrics, logs and reports.
const (
	ClassDNS            = "dns"
	ClassTLS            = "tls"
	ClassRefused        = "refused"
	ClassTimeout        = "timeout"
	ClassProtocol       = "protocol"
	ClassHTTPStatus     = "http_status"
	ClassClosed         = "closed"
	ClassAddressRefused = "address_refused"
	// ClassLimit is a session the relay ended because a message was over
	// its limit (websocket status 1009): learned, reconnected at once,
	// never a failure (limits.go).
	ClassLimit = "limit"
)

// ClassifyFailure names the class of a connection failure: a failed dial or
// the cause of a lost connection.
func ClassifyFailure(err error) string {
	var de *relayconn.DialError
	if errors.As(err, &de) && de.StatusCode != 0 {
		return ClassHTTPStatus
	}
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var recErr tls.RecordHeaderError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	var netErr net.Error
	switch {
	case errors.Is(err, errAddressRefused):
		return ClassAddressRefused
	case errors.As(err, &dnsErr):
		return ClassDNS
	case errors.As(err, &certErr), errors.As(err, &recErr), errors.As(err, &unknownAuth),
		errors.As(err, &hostErr), errors.As(err, &invalid), strings.Contains(err.Error(), "tls:"):
		return ClassTLS
	case errors.Is(err, syscall.ECONNREFUSED):
		return ClassRefused
	case errors.Is(err, relayconn.ErrDead), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return ClassTimeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed), strings.Contains(err.Error(), "EOF"),
		strings.Contains(err.Error(), "status = StatusNormalClosure"), strings.Contains(err.Error(), "StatusGoingAway"):
		return ClassClosed
	default:
		return ClassProtocol
	}
}

// errAddressRefused marks a relay whose address the guard refused.
var errAddressRefused = errors.New("relay address refused")

// logLimiter lets a repeated failure be logged once per class per relay per
// window (12 h): a dead relay retried hourly must not flood the logs.
type logLimiter struct {
	window time.Duration
	last   map[string]time.Time
}

// allow reports whether a failure of class may be logged now.
func (l *logLimiter) allow(class string, now time.Time) bool {
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	if t, ok := l.last[class]; ok && now.Sub(t) < l.window {
		return false
	}
	l.last[class] = now
	return true
}
