// Package security is Warren's adversarial suite: every test is an attack
// a tenant could try against a real `warren serve` (gVisor sandboxes, the
// default runtime), and passes only if the attack fails with the node
// unaffected.
//
// The suite builds nothing itself: it runs bin/warren and bin/envd of this
// checkout (`make build`), as root, with the base template `warren setup`
// installed in /var/lib/warren. TestMain starts one server for the whole
// run in a data directory of its own, on a small loop-mounted ext4 file
// system so that its free space can be measured and filled without
// touching the host's disk; it shares only runsc and the base layer with
// /var/lib/warren. The server uses the network prefix wsec, the range
// 10.127.0.0/16, run dir /run/warren-sec and cgroup parent /warren-sec, so
// it never meets another Warren on the machine.
//
// The tests drive the server as an attacker would: the REST API over
// net/http, template builds in the SDK's call sequence
// (internal/templateclient, or by hand where the attack is in the wire
// format), and envd's Connect RPC through the sandbox proxy with the
// generated clients. Network probes go only to test hosts in network
// namespaces the suite creates (a private-range host, a stand-in metadata
// server, a DNS resolver), each checked with `ip route get` first.
//
// After each case the suite checks that the host files it planted are
// byte-for-byte the same, that a long-lived witness sandbox still runs a
// command, and that killed sandboxes left no mount, network namespace,
// cgroup or runsc process. At the end it kills every sandbox, stops the
// server and checks that nothing of it is left on the machine.
//
// Flags of `warren serve` that a fix introduces are passed only when the
// binary has them (read from `warren serve -h`); a case that needs a
// missing flag fails and says which.
package security
