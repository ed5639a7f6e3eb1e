package regional

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// requirePassword makes every data server of addrs ask for password, and
// each server replicate with it.
func requirePassword(t *testing.T, password string, addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		for _, kv := range [][2]string{{"masterauth", password}, {"requirepass", password}} {
			if err := c.ConfigSet(t.Context(), kv[0], kv[1]).Err(); err != nil {
				t.Fatalf("%s: CONFIG SET %s: %v", addr, kv[0], err)
			}
		}
		c.Close()
	}
}

// storeChecks opens a store on spec with auth and makes one check through
// it; it returns the error of either.
func storeChecks(t *testing.T, spec string, auth RedisAuth) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	store, err := NewRedisStore(ctx, spec, RedisOptions{Auth: auth, Timeout: time.Second})
	if err != nil {
		return err
	}
	defer store.Close()
	e := New(Config{Store: store, Timeout: time.Second}, mustParse(t, "rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 10, window: 1m }\n"))
	var d Decision
	if err := e.Check(ctx, &Request{APIKey: "k"}, &d); err != nil {
		return err
	}
	if !d.Allowed || d.Degraded {
		t.Fatalf("a check through %s: %+v, want allowed and whole", spec, d)
	}
	return nil
}

// TestRedisAuthEveryForm: a Cluster and a Sentinel setup whose servers ask
// for a password serve a store given it (--redis-password), and refuse
// one without; a server that speaks only TLS and asks for client
// certificates serves a store with the CA and a certificate (--redis-ca,
// --redis-cert), over rediss:// and over redis:// with --redis-tls, and
// refuses one without the certificate.
func TestRedisAuthEveryForm(t *testing.T) {
	const pw = "s3cret-pw"
	t.Run("cluster", func(t *testing.T) {
		c := harness.NewRedisCluster(t, harness.RedisClusterOptions{})
		requirePassword(t, pw, c.Addrs()...)
		if err := storeChecks(t, c.Spec(), RedisAuth{Password: pw}); err != nil {
			t.Fatalf("with the password: %v", err)
		}
		// A node may reset a connection now and then (seen once in a
		// run of the whole package): tried again, it must refuse.
		err := storeChecks(t, c.Spec(), RedisAuth{})
		for try := 0; try < 3 && err != nil && strings.Contains(err.Error(), "connection reset"); try++ {
			err = storeChecks(t, c.Spec(), RedisAuth{})
		}
		if !refusedUnauthenticated(err) {
			t.Fatalf("without the password: %v, want a refusal for want of AUTH", err)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		s := harness.NewSentinel(t, harness.SentinelOptions{})
		for _, addr := range s.SentinelAddrs() {
			c := redis.NewSentinelClient(&redis.Options{Addr: addr})
			if err := c.Set(t.Context(), s.MasterName(), "auth-pass", pw).Err(); err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
		addrs := []string{s.Primary.Addr()}
		for _, r := range s.Replicas {
			addrs = append(addrs, r.Addr())
		}
		requirePassword(t, pw, addrs...)
		if err := storeChecks(t, s.URL(), RedisAuth{Password: pw}); err != nil {
			t.Fatalf("with the password: %v", err)
		}
		if err := storeChecks(t, s.URL(), RedisAuth{}); !refusedUnauthenticated(err) {
			t.Fatalf("without the password: %v, want a refusal for want of AUTH", err)
		}
	})
	t.Run("tls", func(t *testing.T) {
		dir := t.TempDir()
		if err := harness.WritePKI(dir, "server", "client"); err != nil {
			t.Fatal(err)
		}
		f := func(name string) string { return filepath.Join(dir, name) }
		addr := startTLSRedis(t, dir, f("server.pem"), f("server-key.pem"), f("ca.pem"))
		withCert := RedisAuth{CA: f("ca.pem"), Cert: f("client.pem"), Key: f("client-key.pem")}
		if err := storeChecks(t, "rediss://"+addr+"/0", withCert); err != nil {
			t.Fatalf("rediss:// with the CA and a certificate: %v", err)
		}
		withCert.TLS = true
		if err := storeChecks(t, "redis://"+addr+"/0", withCert); err != nil {
			t.Fatalf("redis:// with --redis-tls, the CA and a certificate: %v", err)
		}
		if err := storeChecks(t, "rediss://"+addr+"/0", RedisAuth{CA: f("ca.pem")}); err == nil {
			t.Fatal("a store without a client certificate was served")
		}
		if err := storeChecks(t, "rediss://"+addr+"/0", RedisAuth{Cert: f("client.pem"), Key: f("client-key.pem")}); err == nil {
			t.Fatal("a store that trusts only the system's CAs accepted the test CA's server")
		}
	})
	for want, bad := range map[string]RedisAuth{"--redis-key": {Cert: "c.pem"}, "--redis-username needs": {Username: "u"}} {
		if _, _, err := NewRedisClient("redis://127.0.0.1:1/0", bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error naming %s", bad, err, want)
		}
	}
	if _, _, err := NewRedisClient("redis://:pw@127.0.0.1:1/0", RedisAuth{Password: "pw"}); err == nil || !strings.Contains(err.Error(), "give it once") {
		t.Errorf("a password twice: %v", err)
	}
	if _, _, err := NewRedisClient("redis://alice@127.0.0.1:1/0", RedisAuth{Username: "bob", Password: "pw"}); err == nil || !strings.Contains(err.Error(), "differ") {
		t.Errorf("two users: %v", err)
	}
	c, _, err := NewRedisClient("redis://alice@127.0.0.1:1/0", RedisAuth{Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	if o := c.(*redis.Client).Options(); o.Username != "alice" || o.Password != "pw" {
		t.Errorf("the URL's user with --redis-password: %q %q, want alice and the password", o.Username, o.Password)
	}
	c.Close()
}

// refusedUnauthenticated reports whether Redis refused a client for not
// authenticating: NOAUTH, or, for a command as long as a script, Redis 7's
// "unauthenticated bulk length".
func refusedUnauthenticated(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "NOAUTH") || strings.Contains(err.Error(), "unauthenticated"))
}

// startTLSRedis runs a redis-server that speaks only TLS and asks for
// client certificates signed by ca, and returns its address.
func startTLSRedis(t *testing.T, dir, cert, key, ca string) string {
	t.Helper()
	bin, err := harness.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	lis.Close()
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca,
		"--tls-auth-clients", "yes")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	harness.WaitFor(t, 10*time.Second, "redis-server listening on "+addr, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// TestUnixSocket: --redis unix:///path?db=N reaches a Redis on this host by
// its socket, in the database named, with the password given by flag; TLS
// asked for over it is refused at once.
func TestUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	srv := harness.NewRedis(t, harness.RedisOptions{Args: []string{"--unixsocket", sock, "--unixsocketperm", "700"}})
	requirePassword(t, "pw", srv.Addr())
	if err := storeChecks(t, "unix://"+sock+"?db=3", RedisAuth{Password: "pw"}); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "pw", DB: 3})
	defer c.Close()
	if n, err := c.DBSize(t.Context()).Result(); err != nil || n == 0 {
		t.Fatalf("database 3 holds %d keys (%v), want the check's counter", n, err)
	}
	if err := storeChecks(t, "unix://"+sock+"?db=3", RedisAuth{}); err == nil {
		t.Fatal("a check without the password went through")
	}
	if _, _, err := NewRedisClient("unix://"+sock, RedisAuth{TLS: true}); err == nil || !strings.Contains(err.Error(), "no TLS on a Unix socket") {
		t.Fatalf("TLS over a Unix socket: %v", err)
	}
}
