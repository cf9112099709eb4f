package obs_test

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"unsafe"
)

// terminal is a pseudo-terminal: what is written to slave (a terminal, as
// a person's stderr is) is read from master.
type terminal struct{ master, slave *os.File }

// openTerminal opens a pseudo-terminal, or skips the test where the
// machine has none.
func openTerminal(t *testing.T) terminal {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("SKIP: no pseudo-terminal on this machine: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Skipf("SKIP: cannot unlock the pseudo-terminal: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Skipf("SKIP: cannot name the pseudo-terminal: %v", errno)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("SKIP: cannot open the pseudo-terminal's slave: %v", err)
	}
	t.Cleanup(func() { slave.Close() })
	return terminal{master: master, slave: slave}
}
