package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// TestMutualTLS serves gRPC with --tls-client-ca: a caller with a
// certificate from the CA is served, one without is refused; without the
// client CA, TLS alone serves both.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	if err := harness.WritePKI(dir, "server", "client"); err != nil {
		t.Fatal(err)
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	caPEM, _ := os.ReadFile(f("ca.pem"))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	clientCert, err := tls.LoadX509KeyPair(f("client.pem"), f("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	serve := func(cfg TLS) string {
		if err := cfg.Check(); err != nil {
			t.Fatal(err)
		}
		tc, err := cfg.GRPC()
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
		return lis.Addr().String()
	}
	call := func(addr string, certs []tls.Certificate) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs})))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
		return err
	}
	mutual := serve(TLS{Cert: f("server.pem"), Key: f("server-key.pem"), ClientCA: f("ca.pem")})
	if err := call(mutual, []tls.Certificate{clientCert}); err != nil {
		t.Errorf("a caller with the CA's certificate: %v", err)
	}
	if err := call(mutual, nil); err == nil {
		t.Error("a caller without a certificate was served under mutual TLS")
	}
	plain := serve(TLS{Cert: f("server.pem"), Key: f("server-key.pem")})
	if err := call(plain, nil); err != nil {
		t.Errorf("TLS without a client CA, a caller without a certificate: %v", err)
	}
	for want, bad := range map[string]TLS{"--tls-key": {Cert: "c"}, "--tls-client-ca needs": {ClientCA: "ca.pem"}} {
		if err := bad.Check(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error naming %s", bad, err, want)
		}
	}
}
