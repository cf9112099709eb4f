package relayconn

import (
	"context"
	"fmt"
)

// keepalive pings the relay unless it heard from it since the last round
// (Conn.heard), declares the connection dead when a pong does not come back
// in time, then sets the timer for the next round. While
// the read loop is blocked on a slow consumer, pongs cannot be read, so no
// verdict is given then. It runs on the timer's goroutine, counted in loops.
func (c *Conn) keepalive() {
	c.pmu.Lock()
	if c.pingStopped || c.ctx.Err() != nil {
		c.pmu.Unlock()
		return
	}
	c.loops.Add(1)
	c.pmu.Unlock()
	defer c.loops.Done()
	if !c.heard.Swap(false) && !c.delivering.Load() {
		pctx, cancel := context.WithTimeout(c.ctx, c.opts.PongTimeout)
		err := c.ws.Ping(pctx)
		cancel()
		if err != nil && c.ctx.Err() == nil && !c.delivering.Load() {
			c.cancel(fmt.Errorf("%s: %w (no pong within %s)", c.url, ErrDead, c.opts.PongTimeout))
			_ = c.ws.CloseNow()
			return
		}
	}
	c.pmu.Lock()
	if !c.pingStopped && c.ctx.Err() == nil {
		c.pinger.Reset(c.opts.PingInterval)
	}
	c.pmu.Unlock()
}
