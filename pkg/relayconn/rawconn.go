package relayconn

import (
	"net"
	"sync"
	"syscall"
)

type syscallRawConn = syscall.RawConn

// socket holds the TCP connection a websocket was dialled on, so it can
// be closed under the websocket library (Conn.Close).
type socket struct {
	mu sync.Mutex
	nc net.Conn
}

func (s *socket) set(nc net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nc != nil {
		// A dial the transport did not use (a retry): not ours to keep.
		_ = s.nc.Close()
	}
	s.nc = nc
}

func (s *socket) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nc != nil {
		_ = s.nc.Close()
	}
}
