package bus_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

func TestSecurityCheck(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "present.pem")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		name string
		sec  bus.Security
		want string // "" means no error
	}{
		{"none", bus.Security{}, ""},
		{"files present", bus.Security{Creds: file, CA: file, Cert: file, Key: file}, ""},
		{"missing ca", bus.Security{CA: missing}, "GRASP_NATS_CA=" + missing},
		{"missing creds", bus.Security{Creds: missing}, "GRASP_NATS_CREDS=" + missing},
		{"missing key file", bus.Security{Cert: file, Key: missing}, "GRASP_NATS_KEY=" + missing},
		{"cert without key", bus.Security{Cert: file}, "GRASP_NATS_CERT and GRASP_NATS_KEY"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.sec.Check()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("Check = %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n")):
				t.Fatalf("Check = %v, want one line naming %q", err, c.want)
			}
		})
	}
}

// A NATS server whose certificate a private authority signed is joined with
// GRASP_NATS_CA naming that authority, and refused without it.
func TestConnectTLSWithPrivateCA(t *testing.T) {
	dir := t.TempDir()
	caFile, serverCert := privateCA(t, dir)
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		TLS: true, TLSConfig: &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	defer s.Shutdown()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	url := "tls://" + s.Addr().String()
	ctx := context.Background()
	if b, err := bus.Connect(ctx, url, "tls-test", bus.DefaultNames(), bus.Security{}); err == nil {
		b.Close()
		t.Fatal("connected without trusting the private authority")
	}
	b, err := bus.Connect(ctx, url, "tls-test", bus.DefaultNames(), bus.Security{CA: caFile})
	if err != nil {
		t.Fatalf("connect with GRASP_NATS_CA: %v", err)
	}
	defer b.Close()
	if !b.Conn.IsConnected() || !b.Conn.TLSRequired() {
		t.Fatalf("connected %v, TLS %v", b.Conn.IsConnected(), b.Conn.TLSRequired())
	}
}

// privateCA writes a new authority's certificate to dir and returns its
// path and a server certificate for 127.0.0.1 that it signed.
func privateCA(t *testing.T, dir string) (string, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
}

// Passwords in a NATS URL list never reach a log or an error.
func TestRedactURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://fetcher:s3cret@grasp-nats:4222", "nats://fetcher:xxxxx@grasp-nats:4222"},
		{"nats://a:p1@n1:4222,nats://a:p2@n2:4222", "nats://a:xxxxx@n1:4222,nats://a:xxxxx@n2:4222"},
		{"nats://tok3n@n1:4222", "nats://xxxxx@n1:4222"},
		{"nats://u:p%zz@n1:4222", "nats://xxxxx@n1:4222"},
	} {
		got := bus.RedactURL(c.in)
		if got != c.want {
			t.Errorf("RedactURL(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(got, "s3cret") || strings.Contains(got, "p1") || strings.Contains(got, "tok3n") {
			t.Errorf("RedactURL(%q) leaks a secret: %q", c.in, got)
		}
	}
}
