package delayproxy

import (
	"io"
	"net"
	"testing"
	"time"
)

// The proxy delivers late by the delay set, holds bytes while held and
// delivers them in order when released.
func TestDelayProxy(t *testing.T) {
	p := Start(t, startEcho(t))
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg string) time.Duration {
		t.Helper()
		start := time.Now()
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
			t.Fatalf("echo %q: %q %v", msg, buf, err)
		}
		return time.Since(start)
	}
	echo("warm")
	p.SetDelay(Up, 100*time.Millisecond, 0)
	p.SetDelay(Down, 100*time.Millisecond, 0)
	if d := echo("slow"); d < 200*time.Millisecond {
		t.Fatalf("round trip %s through 2×100 ms of delay", d)
	}
	p.SetDelay(Up, 0, 0)
	p.SetDelay(Down, 0, 0)
	p.Hold(Down, true)
	go func() {
		time.Sleep(300 * time.Millisecond)
		p.Hold(Down, false)
	}()
	if d := echo("held"); d < 300*time.Millisecond {
		t.Fatalf("the answer came after %s, before the 300 ms hold ended", d)
	}
}

// Cut ends the connections through the proxy and the proxy goes on
// accepting new ones.
func TestDelayProxyCut(t *testing.T) {
	p := Start(t, startEcho(t))
	echo := func(c net.Conn, msg string) error {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadFull(c, buf)
		return err
	}
	before, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	if err := echo(before, "up"); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if err := echo(before, "cut"); err == nil {
		t.Fatal("a connection cut still echoes")
	}
	after, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if err := echo(after, "again"); err != nil {
		t.Fatalf("a connection after the cut: %v", err)
	}
}

// startEcho starts a TCP server that echoes what it reads, until the test
// ends, and returns its address.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}
