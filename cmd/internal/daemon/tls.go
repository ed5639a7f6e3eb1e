package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
)

// TLS is how a daemon serves its gRPC and HTTP APIs over TLS: a
// certificate and key, and, for mutual TLS on gRPC, the CAs whose client
// certificates it accepts. HTTP stays server-authenticated only, so that
// load balancers' and Kubernetes' probes keep working.
type TLS struct {
	Cert, Key, ClientCA string
}

// AddFlags registers --tls-cert, --tls-key and --tls-client-ca on fs.
func (t *TLS) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&t.Cert, "tls-cert", "", "TLS certificate file for the gRPC and HTTP APIs")
	fs.StringVar(&t.Key, "tls-key", "", "TLS key file for the gRPC and HTTP APIs")
	fs.StringVar(&t.ClientCA, "tls-client-ca", "", "PEM file of the CAs whose client certificates gRPC callers must present (mutual TLS; needs --tls-cert)")
}

// Check says what is wrong with the flags, naming them.
func (t TLS) Check() error {
	if (t.Cert == "") != (t.Key == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if t.ClientCA != "" && t.Cert == "" {
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first")
	}
	return nil
}

// On reports whether the APIs are served over TLS.
func (t TLS) On() bool { return t.Cert != "" }

// HTTP returns the HTTP API's TLS configuration, or nil without TLS.
func (t TLS) HTTP() (*tls.Config, error) {
	if !t.On() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// GRPC returns the gRPC API's TLS configuration, or nil without TLS: with
// --tls-client-ca, a caller without a certificate signed by one of those
// CAs is refused at the handshake.
func (t TLS) GRPC() (*tls.Config, error) {
	cfg, err := t.HTTP()
	if cfg == nil || err != nil || t.ClientCA == "" {
		return cfg, err
	}
	pool, err := certPool("--tls-client-ca", t.ClientCA)
	if err != nil {
		return nil, err
	}
	cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	return cfg, nil
}

// certPool reads the PEM file of CAs a flag names.
func certPool(flag, path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", flag, path)
	}
	return pool, nil
}
