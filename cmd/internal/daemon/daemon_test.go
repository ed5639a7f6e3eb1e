package daemon

import (
	"errors"
	"flag"
	"net"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	newFS := func() (*flag.FlagSet, *string, *int) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		return fs, fs.String("grpc-addr", "a", "where"), fs.Int("n", 1, "how many")
	}
	env := map[string]string{"GEOQUOTA_GRPC_ADDR": "from-env", "GEOQUOTA_N": "7"}
	fs, addr, n := newFS()
	if err := Parse("x", fs, []string{"--n", "9"}, func(k string) string { return env[k] }, "docs/x.md"); err != nil {
		t.Fatal(err)
	}
	if *addr != "from-env" || *n != 9 {
		t.Fatalf("grpc-addr %q n %d: want the variable's, and the command line's over its variable", *addr, *n)
	}
	fs, _, _ = newFS()
	if err := Parse("x", fs, nil, func(k string) string { return map[string]string{"GEOQUOTA_N": "many"}[k] }, "docs/x.md"); err == nil || !strings.Contains(err.Error(), "GEOQUOTA_N") {
		t.Fatalf("a bad variable: %v, want an error naming it", err)
	}
	for _, h := range []string{"-h", "--help"} {
		fs, _, _ = newFS()
		err := Parse("x", fs, []string{h}, func(string) string { return "" }, "docs/x.md")
		var stdout, stderr strings.Builder
		code := ParseFailed(&stdout, &stderr, "x", err)
		out := stdout.String()
		if code != 0 || stderr.Len() > 0 || !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s: exit %d, stderr %q, %v: want the usage on stdout and 0", h, code, stderr.String(), err)
		}
		for _, want := range []string{"usage: x", "-grpc-addr", "GEOQUOTA_GRPC_ADDR GEOQUOTA_N", "docs/x.md"} {
			if !strings.Contains(out, want) {
				t.Fatalf("%s: usage %q does not say %q", h, out, want)
			}
		}
	}
	fs, _, _ = newFS()
	var stdout, stderr strings.Builder
	if code := ParseFailed(&stdout, &stderr, "x", Parse("x", fs, []string{"--nope"}, func(string) string { return "" }, "d")); code != 2 || stdout.Len() > 0 || !strings.HasPrefix(stderr.String(), "x: ") {
		t.Fatalf("an unknown flag: exit %d, stdout %q, stderr %q: want 2 and the error on stderr", code, stdout.String(), stderr.String())
	}
	fs, _, _ = newFS()
	if err := Parse("x", fs, []string{"extra"}, func(string) string { return "" }, "d"); err == nil {
		t.Fatal("an argument left over was accepted")
	}
}

func TestListenAllOrNone(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, err = Listen(Addr{"grpc-addr", "127.0.0.1:0"}, Addr{"http-addr", taken.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), "--http-addr") {
		t.Fatalf("an address in use: %v, want an error naming --http-addr", err)
	}
	ls, err := Listen(Addr{"grpc-addr", "127.0.0.1:0"}, Addr{"http-addr", "127.0.0.1:0"})
	if err != nil || len(ls) != 2 {
		t.Fatalf("two free addresses: %v, %v", ls, err)
	}
	for _, l := range ls {
		l.Close()
	}
}
