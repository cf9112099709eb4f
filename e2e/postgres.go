package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// PrivatePostgres is a PostgreSQL server of one test's own (initdb in a
// temporary directory, its own port), so a test may stop and start it
// without touching the machine's shared server.
type PrivatePostgres struct {
	// URL is the server's postgres database, for FreshDatabase.
	URL string
	// Dir is the data directory (also the socket directory).
	Dir string

	port   int
	asUser string // "postgres" when we are root (postgres refuses to run as root)
}

// StartPrivatePostgres runs initdb and starts the server; it is stopped
// and its directory removed when the test ends. It returns an error (the
// caller skips, naming it) when initdb or pg_ctl is not installed or the
// server does not start.
func StartPrivatePostgres(t testing.TB) (*PrivatePostgres, error) {
	t.Helper()
	for _, tool := range []string{"initdb", "pg_ctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found in PATH: %w", tool, err)
		}
	}
	p := &PrivatePostgres{}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return nil, fmt.Errorf("running as root and there is no postgres user to run the server as: %w", err)
		}
		p.asUser = "postgres"
	}
	// Not t.TempDir: its parents are private to root, and the server runs
	// as postgres.
	dir, err := os.MkdirTemp("", "grasp-e2e-pg-")
	if err != nil {
		return nil, fmt.Errorf("postgres dir: %w", err)
	}
	p.Dir = filepath.Join(dir, "data")
	t.Cleanup(func() {
		_ = p.pgctl("stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	})
	if p.asUser != "" {
		if err := exec.Command("chown", p.asUser, dir).Run(); err != nil {
			return nil, fmt.Errorf("chown %s to %s: %w", dir, p.asUser, err)
		}
	}
	if p.port, err = FreePort(); err != nil {
		return nil, err
	}
	if out, err := p.command("initdb", "-D", p.Dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := p.Start(); err != nil {
		return nil, err
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	return p, nil
}

// command runs name as the server's user.
func (p *PrivatePostgres) command(name string, args ...string) *exec.Cmd {
	if p.asUser == "" {
		return exec.Command(name, args...)
	}
	return exec.Command("runuser", append([]string{"-u", p.asUser, "--", name}, args...)...)
}

func (p *PrivatePostgres) pgctl(args ...string) error {
	full := append([]string{"-D", p.Dir, "-w", "-t", "60"}, args...)
	if out, err := p.command("pg_ctl", full...).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl %v: %w\n%s", args, err, out)
	}
	return nil
}

// Start starts the server (again) and waits until it accepts connections.
// fsync is off: the machine does not crash under the test, the server does.
func (p *PrivatePostgres) Start() error {
	opts := "-p " + strconv.Itoa(p.port) + " -k " + p.Dir + " -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
	return p.pgctl("-l", filepath.Join(p.Dir, "server.log"), "-o", opts, "start")
}

// Stop stops the server the hard way (pg_ctl -m immediate: no checkpoint,
// clients cut off, crash recovery at the next start), like a kill.
func (p *PrivatePostgres) Stop() error { return p.pgctl("stop", "-m", "immediate") }

// FreshDatabase creates an empty database on the PostgreSQL server at
// serverURL, drops it when the test ends (after everything registered
// later, so after the processes that use it are gone), and returns its URL.
func FreshDatabase(t testing.TB, serverURL string) string {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatalf("PostgreSQL URL: %v", err)
	}
	db, err := sql.Open("postgres", serverURL)
	if err != nil {
		t.Fatalf("PostgreSQL %s: %v", store.Redact(serverURL), err)
	}
	defer db.Close()
	name := fmt.Sprintf("grasp_e2e_%d_%d", os.Getpid(), time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE DATABASE `+pq.QuoteIdentifier(name)); err != nil {
		t.Fatalf("create database %s on %s: %v", name, store.Redact(serverURL), err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("postgres", serverURL)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, `DROP DATABASE IF EXISTS `+pq.QuoteIdentifier(name)+` WITH (FORCE)`); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}
