// Package envdinfo is what the host and envd, the daemon inside every
// sandbox, agree on: the port envd listens on, the version it reports,
// and the environment variable that carries its first access token. It is
// a leaf, so that envd (a static binary of its own), the node, the proxy,
// the sandbox manager and the template builder share one definition.
package envdinfo

// Port is where envd listens inside every sandbox (E2B's envd port).
const Port = 49983

// Version is the envd version reported to the platform and the SDK, and
// recorded for sandboxes and template builds. The SDK gates features on
// it (wire contract §10); 0.6.4 enables all of them.
const Version = "0.6.4"

// AccessTokenEnv carries envd's initial access token from the runtime
// into envd, which reads it once and removes it from its environment.
const AccessTokenEnv = "WARREN_ENVD_ACCESS_TOKEN"
