// Package cluster is the cluster mode of Warren's adversarial suite
// (test/security): attacks on a deployment of api processes in front of
// nodes, tried from outside. TestMain starts one cluster for the whole
// run: a PostgreSQL database of its own (on the local server that
// scripts/install-deps.sh installs), two `warren serve --role api`
// replicas (the first with an HTTPS proxy listener too) and two `--role
// node` processes running real gVisor sandboxes, all from bin/warren of
// this checkout (WARREN_SEC_BIN names another binary, to see the attacks
// against an older build). The nodes use the network prefixes wsca and
// wscb, the ranges 10.151.0.0/16 and 10.152.0.0/16, run dirs
// /run/warren-wsca|wscb and cgroup parents /warren-wsca|wscb, so that they
// never meet another Warren on the machine.
//
// The attacks use only what a tenant can reach (the API and the sandbox
// proxy, over HTTP), but for the replay and forgery cases, which stand
// for an attacker on the network between the processes: those put a
// recording or tampering TCP proxy in front of a node (its address in the
// store is changed to the proxy's), or sign with the cluster secret.
// Each case checks that the victim sandbox still runs as it did, that no
// team gained or lost sandboxes, and at the end that the nodes left
// nothing on the machine.
package cluster
