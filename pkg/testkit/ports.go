package testkit

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
)

// Ports handed out for a later bind are taken below Linux's default
// ephemeral range (32768–60999): a port the kernel picked for us ("listen
// on :0") can be handed to another process's outgoing connection before
// our child binds it, which e2e runs saw as "address already in use".
const (
	reservedPortMin = 20000
	reservedPortMax = 32767
)

var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// FreePort returns a TCP port on 127.0.0.1 that is free now, is outside the
// ephemeral range and has not been returned before in this process, for a
// child process that must know its address before it starts (and keep it
// across restarts).
func FreePort() (int, error) {
	handedOutMu.Lock()
	defer handedOutMu.Unlock()
	for range 200 {
		p := reservedPortMin + rand.IntN(reservedPortMax-reservedPortMin+1)
		if handedOut[p] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // in use
		}
		_ = ln.Close()
		handedOut[p] = true
		return p, nil
	}
	return 0, errors.New("free port: none free in 20000–32767 after 200 tries")
}
