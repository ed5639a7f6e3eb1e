package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// startNATS runs a NATS server on a loopback port with opts for the test.
func startNATS(t *testing.T, opts natsserver.Options) string {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	ns, err := natsserver.NewServer(&opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS did not start")
	}
	return ns.ClientURL()
}

// TestNATSAuthConnects connects with each of NATS's ways to authenticate
// against a server that requires it, and fails without them.
func TestNATSAuthConnects(t *testing.T) {
	dir := t.TempDir()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	seedFile := filepath.Join(dir, "user.nk")
	os.WriteFile(seedFile, seed, 0o600)
	if err := harness.WritePKI(dir, "server", "client"); err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	serverCert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		server natsserver.Options
		auth   NATSAuth
	}{
		{"user", natsserver.Options{Users: []*natsserver.User{{Username: "gq", Password: "s3cret"}}}, NATSAuth{User: "gq", Password: "s3cret"}},
		{"token", natsserver.Options{Authorization: "t0ken"}, NATSAuth{Token: "t0ken"}},
		{"nkey", natsserver.Options{Nkeys: []*natsserver.NkeyUser{{Nkey: pub}}}, NATSAuth{NKey: seedFile}},
		{"tls client certificate", natsserver.Options{
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
			TLS:       true, TLSVerify: true, TLSTimeout: 2,
			Users: []*natsserver.User{{Username: "gq", Password: "pw"}}},
			NATSAuth{User: "gq", Password: "pw", CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client-key.pem")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startNATS(t, tc.server)
			if nc, err := nats.Connect(url, nats.Timeout(2*time.Second)); err == nil {
				nc.Close()
				t.Fatal("connected with no credentials")
			}
			opts, err := tc.auth.Options()
			if err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(url, append(opts, nats.Timeout(2*time.Second))...)
			if err != nil {
				t.Fatalf("with %+v: %v", tc.auth, err)
			}
			nc.Close()
			if !tc.auth.Authenticated(url) {
				t.Errorf("Authenticated(%q) = false with %+v", url, tc.auth)
			}
		})
	}
}

func TestNATSAuthFlags(t *testing.T) {
	var a NATSAuth
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	a.AddFlags(fs)
	env := map[string]string{"GEOQUOTA_NATS_USER": "gq", "GEOQUOTA_NATS_PASSWORD": "from-env"}
	if err := Parse("x", fs, nil, func(k string) string { return env[k] }, "d"); err != nil {
		t.Fatal(err)
	}
	if a.User != "gq" || a.Password != "from-env" || a.Check() != nil {
		t.Fatalf("from the environment: %+v, %v", a, a.Check())
	}
	for url, want := range map[string]bool{
		"nats://127.0.0.1:4222":                       false,
		"nats://u:p@127.0.0.1:4222":                   true,
		"nats://tok@127.0.0.1:4222":                   true,
		"nats://u:p@a:4222,nats://b:4222":             false,
		"nats://u:p@a:4222, nats://u:p@b:4222":        true,
		"":                                            false,
		"nats://%zz@127.0.0.1:4222":                   false,
		"tls://u:p@127.0.0.1:4222,tls://v:q@b.x:4222": true,
	} {
		if got := (NATSAuth{}).Authenticated(url); got != want {
			t.Errorf("Authenticated(%q) = %v, want %v", url, got, want)
		}
	}
	bad := map[string]NATSAuth{
		"--nats-creds and --nats-token": {Creds: "x", Token: "y"},
		"--nats-password":               {User: "u"},
		"--nats-tls-key":                {Cert: "c"},
		"--nats-tls-ca":                 {CA: "/nonexistent/ca.pem"},
	}
	for want, a := range bad {
		if err := a.Check(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error naming %s", a, err, want)
		}
	}
}

func TestInsecureGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	Insecure(reg, map[string]bool{"nats": true, "memberlist": false})
	want := `# HELP geoquota_insecure 1 while a link (nats, memberlist) runs unauthenticated or unencrypted, 0 while it is secured
# TYPE geoquota_insecure gauge
geoquota_insecure{link="memberlist"} 0
geoquota_insecure{link="nats"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "geoquota_insecure"); err != nil {
		t.Fatal(err)
	}
}

// TestNATSErrorsAreLoggedOnce: a publish the servers refuse is logged
// once as an error that says what is wrong, however often it repeats, and
// is kept for an error at start.
func TestNATSErrorsAreLoggedOnce(t *testing.T) {
	url := startNATS(t, natsserver.Options{Users: []*natsserver.User{{Username: "r", Password: "p",
		Permissions: &natsserver.Permissions{Publish: &natsserver.SubjectPermission{Allow: []string{"mine"}}}}}})
	var logged harness.LogBuffer // the handler logs from NATS's callback goroutine
	reg := prometheus.NewRegistry()
	h := NewNATSErrors(slog.New(slog.NewTextHandler(&logged, nil)), reg)
	nc, err := nats.Connect(url, nats.UserInfo("r", "p"), h.Option())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 20 {
		nc.Publish("theirs", []byte("x"))
	}
	nc.Publish("mine", []byte("x"))
	nc.Flush()
	deadline := time.Now().Add(5 * time.Second)
	for (h.Last() == nil || !strings.Contains(logged.String(), "NATS refused")) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // waiting on the server's asynchronous answer, with a deadline
	}
	if h.Last() == nil || !strings.Contains(h.Last().Error(), "theirs") {
		t.Fatalf("last error %v, want the refusal of theirs", h.Last())
	}
	if n := strings.Count(logged.String(), "NATS refused"); n != 1 || !strings.Contains(logged.String(), "level=ERROR") {
		t.Fatalf("logged %d times:\n%s", n, logged.String())
	}
	if n := testutil.ToFloat64(h.refused); n < 1 {
		t.Fatalf("geoquota_nats_refused_total %v, want every refusal counted", n)
	}
}
