package regional

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// RedisAuth is how a store proves itself to Redis and checks that the
// server is the one it means, for every form of --redis alike: a single
// server, Sentinel and Cluster.
type RedisAuth struct {
	// Username and Password are sent with AUTH to the data servers (an ACL
	// user, or requirepass alone without a Username). A redis:// or
	// redis-sentinel:// URL may carry them instead, not both.
	Username, Password string
	// SentinelPassword is AUTH for the sentinels themselves.
	SentinelPassword string
	// TLS connects over TLS (as rediss:// does); CA names the PEM file of
	// the CAs that sign the servers' certificates instead of the system's,
	// and Cert and Key a client certificate for servers that ask for one.
	// A CA or a client certificate turns TLS on.
	TLS           bool
	CA, Cert, Key string
}

// Check says what is wrong, naming regiond's flags.
func (a RedisAuth) Check() error {
	if (a.Cert == "") != (a.Key == "") {
		return errors.New("--redis-cert and --redis-key go together")
	}
	if a.Username != "" && a.Password == "" {
		return errors.New("--redis-username needs --redis-password")
	}
	return nil
}

// tlsConfig returns the TLS configuration, or nil for plain TCP; base is
// what the URL asked for (rediss://), if anything.
func (a RedisAuth) tlsConfig(base *tls.Config) (*tls.Config, error) {
	if base == nil && !a.TLS && a.CA == "" && a.Cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if base != nil {
		cfg = base.Clone()
	}
	if a.CA != "" {
		pem, err := os.ReadFile(a.CA)
		if err != nil {
			return nil, fmt.Errorf("--redis-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-ca %s: no PEM certificate in it", a.CA)
		}
		cfg.RootCAs = pool
	}
	if a.Cert != "" {
		cert, err := tls.LoadX509KeyPair(a.Cert, a.Key)
		if err != nil {
			return nil, fmt.Errorf("--redis-cert/--redis-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// credentials merges the URL's user and password with the flags'.
func (a RedisAuth) credentials(urlUser, urlPassword string) (string, string, error) {
	if a.Password != "" && urlPassword != "" {
		return "", "", errors.New("--redis-password and a password in --redis: give it once")
	}
	if a.Password != "" {
		user := a.Username
		switch {
		case user == "":
			user = urlUser
		case urlUser != "" && urlUser != user:
			return "", "", fmt.Errorf("--redis-username %q and the user %q in --redis differ", user, urlUser)
		}
		return user, a.Password, nil
	}
	return urlUser, urlPassword, nil
}
