// Package blobstore tests paused sandboxes that outlive their node: a
// cluster of one api and two nodes (PostgreSQL, gVisor sandboxes) shares a
// real S3-compatible server (SeaweedFS on loopback, internal/blobstore/
// s3test) as its --blob-store. A sandbox paused on the first node is
// resumed on the second after the first is killed with SIGKILL, with its
// files and processes; a corrupted blob is refused and the sandbox stays
// paused; another team cannot reach it; the store's credentials appear in
// no log and no API answer. Then, on the same cluster, CrashAtEveryStep
// kills a node at each step of a pause into the store and of a resume
// (the fault points of a test build of warren, -tags warren_faults,
// built by the package once per run: faults_test.go).
//
// The nodes use the network prefixes wbsa, wbsb (and wbsc, without the
// blob store, in the benchmark), the ranges 10.163.0.0/18, 10.163.64.0/18
// and 10.163.128.0/18, run dirs /run/warren-wbs? and cgroup parents
// /warren-wbs?: nothing else on the machine uses them.
package blobstore
