package main

import (
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
)

// TestTakenAddressNamesItsFlag: with its gRPC or its HTTP address taken,
// regiond --dev exits 1 naming the flag that moves it (README.md).
func TestTakenAddressNamesItsFlag(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, flag := range []string{"--grpc-addr", "--http-addr"} {
		out, err := exec.Command(binary, "--dev", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			flag, taken.Addr().String()).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("%s taken: %v, want exit status 1\n%s", flag, err, out)
		}
		want := "regiond: " + flag + ": listen tcp " + taken.Addr().String() + ": bind: address already in use"
		if !strings.Contains(string(out), want) {
			t.Errorf("%s taken: regiond said\n%s\nwant a line %q", flag, out, want)
		}
	}
}
