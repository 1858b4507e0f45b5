// Package egress is what a sandbox may reach beyond the node's own rules:
// the per-sandbox policy (Config, compiled into a Policy), the node's
// transparent egress proxy that enforces its domain rules, the per-node
// certificate authority it intercepts TLS with, and the audit log of
// every egress decision.
//
// # Where each rule is enforced
//
// Address rules (allowOut/denyOut CIDRs and IPs, allow_internet_access)
// are enforced in the kernel on the sandbox's network slot
// (network.SlotPolicy). A policy that names a domain, a transform rule or
// an upstream proxy also sends the slot's TCP to the Proxy (the kernel
// redirects it; the original destination comes from SO_ORIGINAL_DST).
// The node's own rules come first and always hold: the proxy dials
// nothing the node refuses sandboxes (Config.Refused), whatever a policy
// or a name says.
//
// # What the proxy does with a connection
//
// It reads the client's first bytes, on every port: a TLS ClientHello
// gives the SNI, an HTTP request the Host. Then, in this order:
//
//  1. The destination is allowed by an allowOut address: allowed.
//  2. The SNI or Host matches an allowOut domain: allowed, but only to an
//     address that name resolves to (with the node's resolvers); if the
//     sandbox dialled another address, the connection goes to one the
//     name resolves to instead, so naming an allowed domain opens no
//     other address (an SNI or Host that does not match the destination,
//     /etc/hosts tricks, rebinding to a private address: the node's
//     rules refuse private answers).
//  3. The destination is denied by denyOut: refused with a TCP reset.
//  4. Otherwise allowed.
//
// Anything that is neither TLS nor HTTP (or says no name) is judged by
// the address rules alone. Plain HTTP is relayed request by request, and
// every request after the first of a keep-alive connection that names
// another host is judged again by that host: refused (403) if the policy
// forbids it, or if the connection cannot carry it (421: a name allowed
// only by domain whose addresses do not include this connection's, or a
// host with rules), so that a server hosting an allowed and a forbidden
// name at one address never gets the forbidden one's requests. A server-first protocol (SSH, SMTP) to an
// address the rules allow is spliced as soon as the server speaks.
//
// A host that has transform rules gets its requests rewritten: plain HTTP
// is parsed request by request; TLS is terminated with a certificate the
// node's CA issues for that host (the CA is in every sandbox's trust
// store) and re-encrypted to the real host, whose certificate is
// verified. ${e2b.secrets.NAME} in a header value is resolved per
// request from the sandbox's team's secrets, and
// ${e2b.identity.tokens.NAME} becomes a workload identity token (a
// JWT-SVID, package identity) minted for this request, for this sandbox,
// with the audience its iam.tokens gave NAME (a name it did not ask for
// is refused, never minted); neither value ever enters the sandbox. Every request on such a connection must name the same host,
// and the upstream address must be one the host resolves to, so a
// secret can never be sent to another server.
//
// With an egressProxy, every allowed connection is made through that
// proxy instead of directly: SOCKS5 (RFC 1928/1929, as E2B's) at
// host:port, HTTP CONNECT at http://host:port. A domain match or a host
// with rules is asked for by name (the proxy resolves it: remote DNS),
// anything else by address. The proxy's own address must be one the
// node lets sandboxes reach, and a proxy that fails or breaks the
// protocol fails the connection: it never goes out directly.
package egress
