package harness

import (
	"slices"
	"testing"
)

// TestMovePorts: a daemon that lost the race for its ports gets new ones,
// in its fields and on its command line, and nothing else changes.
func TestMovePorts(t *testing.T) {
	dm := &Daemon{Name: "ap-1", Kind: "regiond", GRPCAddr: "127.0.0.1:1001", HTTPAddr: "127.0.0.1:1002", Memberlist: "127.0.0.1:1003",
		proc: &process{args: []string{"--grpc-addr", "127.0.0.1:1001", "--http-addr", "127.0.0.1:1002",
			"--memberlist-addr", "127.0.0.1:1003", "--peers", "127.0.0.1:2003"}}}
	if err := dm.movePorts(); err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"} {
		if slices.Contains(dm.proc.args, old) || dm.GRPCAddr == old || dm.HTTPAddr == old || dm.Memberlist == old {
			t.Fatalf("address %s still given: %+v %v", old, dm, dm.proc.args)
		}
	}
	want := []string{"--grpc-addr", dm.GRPCAddr, "--http-addr", dm.HTTPAddr, "--memberlist-addr", dm.Memberlist, "--peers", "127.0.0.1:2003"}
	if !slices.Equal(dm.proc.args, want) {
		t.Fatalf("args %v, want %v", dm.proc.args, want)
	}
}
