// Package webhook delivers sandbox lifecycle events to the teams'
// webhooks, E2B's way: a POST of the event's JSON with the headers
// e2b-webhook-id, e2b-delivery-id, e2b-signature-version (v1) and
// e2b-signature (Sign), retried on a non-2xx answer or no answer
// (3 more tries, 10 s apart), with the same event ID each time.
//
// Events and their deliveries are written by the store in the
// transaction of the sandbox change that makes them (internal/store,
// sql_events.go): a Dispatcher only sends what is there, so a crash
// loses nothing (at least once). Each webhook is delivered by one worker
// at a time, under a lease in the store (one process in a cluster), in
// the order its events were made; a slow or dead endpoint holds its own
// worker only, and its queue is bounded.
//
// Webhook URLs are hostile: the Guard refuses loopback, private,
// link-local (cloud metadata) and reserved addresses unless the operator
// allows a range (--webhook-allow-cidr). A URL's host is resolved once
// per attempt and the connection pinned to that address, checked again
// at the socket; redirects are not followed; each attempt has a timeout
// and reads a bounded part of the answer.
package webhook
