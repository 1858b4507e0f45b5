package codeinterp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// maxCodeBytes bounds an /execute body (the cell's code and its env vars).
const maxCodeBytes = 16 << 20

type executeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// execute is POST /execute: it runs a cell in its context (context_id, or
// the default context of language, python by default) and streams its
// output as JSON lines, ending with end_of_execution.
func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Authorize != nil && !s.cfg.Authorize(r.Header.Get("X-Access-Token")) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintln(w, `{"code":401,"message":"missing or invalid access token (X-Access-Token)"}`)
		return
	}
	var req executeRequest
	if !decodeBody(w, r, maxCodeBytes, &req) {
		return
	}
	if req.ContextID != "" && req.Language != "" {
		plain(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	if err := checkEnvVars(req.EnvVars); err != nil {
		plain(w, http.StatusBadRequest, err.Error())
		return
	}
	var c *execContext
	var err error
	if req.ContextID != "" {
		if c, err = s.lookup(req.ContextID); err != nil {
			plain(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", req.ContextID))
			return
		}
	} else {
		language := normalizeLanguage(req.Language)
		if !supported[language] {
			plain(w, http.StatusBadRequest, fmt.Sprintf("Language %q is not supported (supported: python, bash, javascript)", req.Language))
			return
		}
		if c, err = s.defaultContext(language); err != nil {
			plain(w, statusOf(err), err.Error())
			return
		}
	}

	// One execution at a time: wait for the running one (or give up with
	// the client).
	select {
	case c.turn <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	defer func() { <-c.turn }()

	k, err := c.ensureKernel(s)
	if err != nil {
		if statusOf(err) == http.StatusNotFound {
			plain(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", c.ID))
		} else {
			plain(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	op := map[string]any{"op": "execute", "code": req.Code, "max_output": s.cfg.MaxOutputBytes, "max_line": s.cfg.MaxLineBytes}
	if len(req.EnvVars) > 0 {
		op["env"] = req.EnvVars
	}
	if changed := k.sandboxEnvChanges(s.cfg.Env()); changed != nil {
		op["sandbox_env"] = changed
	}
	if err := k.send(op); err != nil {
		plain(w, http.StatusInternalServerError, "the context's kernel is gone: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	s.stream(w, r, k)
}

// checkEnvVars refuses names a kernel's environment cannot hold.
func checkEnvVars(env map[string]string) error {
	if len(env) > 1000 {
		return fmt.Errorf("at most 1000 env_vars, not %d", len(env))
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("env_vars: invalid variable %q (a name without '=' or NUL, a value without NUL)", k)
		}
	}
	return nil
}

var (
	endLine       = []byte(`{"type":"end_of_execution"}`)
	keepaliveLine = []byte(`{"type":"keepalive"}`)
)

// stream relays one execution's events from k to the client until the
// bridge's "end". When the client goes away the kernel is interrupted and
// the rest of the cell's output is read and dropped, so that the next
// execution starts clean; a cell that does not stop within DrainTimeout
// loses its kernel.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, k *kernel) {
	rc := http.NewResponseController(w)
	gone := false
	write := func(line []byte) {
		if gone {
			return
		}
		_, err := w.Write(append(line, '\n'))
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			gone = true
		}
	}
	var drainDeadline, reinterrupt <-chan time.Time
	var again *time.Ticker
	defer func() {
		if again != nil {
			again.Stop()
		}
	}()
	interrupt := func() {
		if drainDeadline == nil {
			k.interrupt()
			drainDeadline = time.After(s.cfg.DrainTimeout)
			// A signal can go unseen (a cell's own SIGINT handler, or
			// one that lands between a runtime's checks): it is sent
			// again until the cell ends or its kernel is killed.
			again = time.NewTicker(reinterruptEvery)
			reinterrupt = again.C
		}
	}
	tick := time.NewTicker(s.cfg.Keepalive)
	defer tick.Stop()
	clientDone := r.Context().Done()
	budget, truncated := s.cfg.MaxOutputBytes, false
	for {
		select {
		case line, ok := <-k.events:
			if !ok {
				write(deathEvent(k.killReason()))
				write(endLine)
				return
			}
			var ev struct {
				Type string
				Dead bool
			}
			// The bridge runs as the sandbox's user, whose cells may write
			// into its stdout too: only JSON objects reach the client.
			if json.Unmarshal(line, &ev) != nil {
				continue
			}
			switch ev.Type {
			case "end":
				if ev.Dead { // the next execution must not reach this bridge
					k.kill()
				}
				write(endLine)
				return
			case "stdout", "stderr", "result":
				// The bridge applies the same bound and notes it; this
				// one holds whatever the bridge sends.
				if truncated || len(line) > budget {
					if !truncated {
						truncated = true
						write(noteLine(fmt.Sprintf("[warren: this cell's output passed %d bytes; the rest is dropped]\n", s.cfg.MaxOutputBytes)))
					}
					continue
				}
				budget -= len(line)
			}
			write(line)
		case <-tick.C:
			write(keepaliveLine)
		case <-clientDone:
			clientDone, gone = nil, true
		case <-reinterrupt:
			k.interrupt()
		case <-drainDeadline:
			k.killWith("")
			drainDeadline = make(chan time.Time) // never again
			reinterrupt = nil
		}
		if gone {
			interrupt()
		}
	}
}

// reinterruptEvery is how often an abandoned cell that has not ended is
// interrupted again.
const reinterruptEvery = time.Second

func noteLine(text string) []byte {
	b, _ := json.Marshal(map[string]string{"type": "stderr", "text": text})
	return b
}

// deathEvent is the error an execution ends with when its bridge is gone.
func deathEvent(reason string) []byte {
	ev := map[string]string{"type": "error", "traceback": ""}
	switch reason {
	case "ContextRestarting":
		ev["name"], ev["value"] = "ContextRestarting", "Context was restarted"
	case "ContextRemoved":
		ev["name"], ev["value"] = "ContextRemoved", "Context was removed"
	case "":
		ev["name"], ev["value"] = "UnexpectedEndOfExecution", "the context's kernel exited before the execution finished; run the cell again (its state is lost)"
	default:
		ev["name"], ev["value"] = "UnexpectedEndOfExecution", reason
		if strings.HasPrefix(reason, outOfMemoryReason) {
			ev["name"] = "KernelDied"
		}
	}
	b, _ := json.Marshal(ev)
	return b
}
