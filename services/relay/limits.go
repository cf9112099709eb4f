package relay

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxTrackedAddresses bounds the per-address limiter tables: beyond it an
// arbitrary entry is forgotten (its address starts afresh), so a flood of
// source addresses costs bounded memory.
const maxTrackedAddresses = 65536

// addrLimiter is a token bucket per client address, on an injectable clock.
type addrLimiter struct {
	mu      sync.Mutex
	now     func() time.Time
	every   rate.Limit
	burst   int
	buckets map[netip.Addr]*rate.Limiter
}

func newAddrLimiter(perSecond float64, burst int, now func() time.Time) *addrLimiter {
	return &addrLimiter{now: now, every: rate.Limit(perSecond), burst: max(burst, 1), buckets: map[netip.Addr]*rate.Limiter{}}
}

// allow takes one token for addr, reporting false when its bucket is empty.
func (l *addrLimiter) allow(addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.buckets[addr]
	if b == nil {
		if len(l.buckets) >= maxTrackedAddresses {
			l.evict(now)
		}
		b = rate.NewLimiter(l.every, l.burst) // starts full
		l.buckets[addr] = b
	}
	return b.AllowN(now, 1)
}

// evict forgets idle buckets (full again, so forgetting changes nothing),
// or one arbitrary bucket if none is idle.
func (l *addrLimiter) evict(now time.Time) {
	for a, b := range l.buckets {
		if b.TokensAt(now) >= float64(l.burst) {
			delete(l.buckets, a)
		}
	}
	if len(l.buckets) < maxTrackedAddresses {
		return
	}
	for a := range l.buckets {
		delete(l.buckets, a)
		return
	}
}

// connCounter counts open connections per address.
type connCounter struct {
	mu    sync.Mutex
	max   int
	count map[netip.Addr]int
}

// acquire reserves a connection slot for addr.
func (c *connCounter) acquire(addr netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count[addr] >= c.max {
		return false
	}
	c.count[addr]++
	return true
}

func (c *connCounter) release(addr netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count[addr] <= 1 {
		delete(c.count, addr)
		return
	}
	c.count[addr]--
}

// prefixList is a list of addresses and networks from configuration.
type prefixList []netip.Prefix

// parsePrefixes parses a comma-separated list of IP addresses and CIDR
// networks.
func parsePrefixes(s string) (prefixList, error) {
	var out prefixList
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", f, err)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", f, err)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

func (l prefixList) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range l {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
